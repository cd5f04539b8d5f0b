"""The run page while the run goes (issue 13): a long real DDP run through the service; the page
shows step-time figures and curves from the partial traces and keeps updating without a reload,
log lines arrive before the run ends; cancelled at ~50 steps, the page keeps what it saw.

No timing is asserted: the checks wait (generously) for states, and compare counts."""

from __future__ import annotations

from playwright.sync_api import expect

from tests.conftest import wait_for
from tests.frontend.browser import shot

# the timed model: ~0.2 s a step whatever the machine (sleeps, not compute), so 300 steps
# (about a minute) outlast the checks with a wide margin, and a cancel at step ~50 lands
LONG = {"preset": "ddp", "name": "live ddp", "train": {"steps": 300},
        "model": {"arch": "timed", "layers": 2, "hidden": 16, "t_forward": 0.03,
                  "t_backward_input": 0.03, "t_backward_weight": 0.03}}


def steps_on_page(page, chart: str = "throughput-chart") -> int:
    """Steps drawn on the step-time (or loss) curve."""
    return page.evaluate("""(id) => {
        const d = document.getElementById(id).data;
        return d && d.length ? d[0].x.length : 0 }""", chart)


def test_the_page_is_live_and_a_cancelled_run_keeps_its_steps(svc, page):
    rid = svc.submit(LONG)["id"]
    page.goto(f"{svc.url}/runs/{rid}")
    page.wait_for_function("() => Number(document.body.dataset.liveUpdates || 0) >= 1",
                           timeout=180_000)
    card = page.locator("#cards [data-key='step_time_s']")
    expect(card).not_to_have_attribute("data-value", "", timeout=60_000)
    first = steps_on_page(page)
    assert first >= 1
    wait_for(lambda: steps_on_page(page, "loss-chart") >= 1, 60, "a loss point")
    # the page keeps growing without a reload while the run goes
    wait_for(lambda: steps_on_page(page) > first, 120, "more steps on the live page")
    assert svc.run(rid)["status"] == "running"
    # log lines arrive while the run goes (the [paralab] launch line at least, then rank lines)
    expect(page.locator("#log")).to_contain_text("launching on")
    expect(page.locator("#log")).to_contain_text("step 3 loss")  # a line per step, as it ends
    shot(page, "run-live")
    # cancel at ~50 steps (asked to confirm; more steps would prove nothing more, they only
    # take time); the page keeps every step it saw
    wait_for(lambda: steps_on_page(page) >= 50 or svc.run(rid)["status"] != "running", 240,
             "50 steps")
    page.allowed_dialogs.append("Cancel run")
    page.click("#cancel-btn")
    done = svc.wait_status(rid, ("cancelled", "succeeded"), 120)
    assert done["status"] == "cancelled", done["status"]
    # the page first redraws from the partial traces, then once more from the stored analysis
    # the worker writes after the stop: compare with that one
    page.wait_for_selector("body[data-charts-ready='1'][data-analysis='final']", timeout=150_000)
    m = svc.http.get(f"/api/runs/{rid}/metrics").json()
    kept = [r for r in m["tables"]["throughput"] if r["step_s"] is not None]
    assert len(kept) >= 45, len(kept)
    assert steps_on_page(page) == len(kept)
    losses = [r for r in m["tables"]["throughput"] if r["loss"] is not None]
    assert len(losses) >= 45
    assert steps_on_page(page, "loss-chart") == len(losses)
    # one download menu, nothing offered twice
    expect(page.locator("#downloads")).to_contain_text("trace-rank0.jsonl", timeout=90_000)
    page.click("#downloads summary")
    texts = page.eval_on_selector_all("#downloads a", "as => as.map(a => a.textContent)")
    hrefs = page.eval_on_selector_all("#downloads a", "as => as.map(a => a.href)")
    assert len(set(hrefs)) == len(hrefs) and len(set(texts)) == len(texts)
    assert "trace-rank0.jsonl" in texts and "analysis.json" not in texts
    # what torch's tools read: the flight dumps as one zip (this run saved no checkpoint)
    flight = hrefs[texts.index("Flight records (torch's fr_trace)")]
    assert flight.endswith(f"/api/runs/{rid}/export?format=flight")
    assert "Checkpoint (torch.distributed.checkpoint)" not in texts
    z = svc.http.get(flight.split(svc.url, 1)[1])
    assert z.status_code == 200 and z.content[:2] == b"PK"
    shot(page, "run-cancelled")
    # a quiet terminal: the worker channel's routine calls leave no access-log line each
    served = (svc.tmp / "backend.log").read_text()
    assert f"GET /api/runs/{rid}" in served
    assert "/api/internal/" not in served
