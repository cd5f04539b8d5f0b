"""The run page's first screen tells the truth at a glance (issue 37, items 3, 4 and 8), in
Chromium on the real service: a crashed run leads with the rank that failed first, its cause
and its traceback, the ranks that only lost their peer after it, grouped, without emoji; a hung
run shows the age of its last progress and the countdown to runtime.hang_timeout_s while it
still says "running", then the verdict; a resumed run's charts share one step axis with its
parent's loss drawn under its own, and a run that succeeded has no "What went wrong"."""

from __future__ import annotations

import re

from playwright.sync_api import expect

from tests.conftest import wait_for
from tests.frontend.browser import shot

TINY = {"model": {"arch": "mlp", "hidden": 8, "layers": 2}}

# Three ranks, rank 1 raises at step 2: ranks 0 and 2 then fail on gloo's "Connection closed
# by peer ... GLHF! 🏖️" (the victims), and rank 0's error file is the first in rank order.
CRASH = {"preset": "ddp", "name": "crash on rank 1", **TINY,
         "parallel": {"dp": 3}, "runtime": {"nproc_per_node": 3},
         "train": {"steps": 4, "global_batch": 9},
         "faults": [{"kind": "crash", "ranks": [1], "step": 2}]}

# Rank 1 never enters step 3's all_reduce; the worker stops the run 45 s after the last
# progress: time for the page (Plotly is slow to load on a busy machine) to show the age and
# the countdown while the run still goes.
HANG_S = 45
HUNG = {"preset": "dp-allreduce", "name": "hangs at step 3", **TINY,
        "train": {"steps": 5, "global_batch": 8, "optimizer": "sgd"},
        "runtime": {"hang_timeout_s": HANG_S},
        "faults": [{"kind": "hang", "ranks": [1], "step": 3, "op": "all_reduce"}]}

# characters Chromium draws as a box without an emoji font (gloo's 🏖️: the pictographs' planes
# and the emoji presentation selector; the page's own ⚠ is in the text fonts)
EMOJI = re.compile("[\U0001F000-\U0001FAFF\uFE0F]")


def _finished(svc, rid, status, timeout=240):
    run = svc.wait_status(rid, ("succeeded", "failed", "hung", "timed_out", "cancelled"),
                          timeout)
    assert run["status"] == status, run["error"]
    return wait_for(lambda: (r := svc.run(rid))["summary"] is not None and r, 60, "summary")


def test_a_crashed_run_leads_with_the_rank_that_failed_first(svc, page):
    rid = svc.submit(CRASH)["id"]
    run = _finished(svc, rid, "failed")
    left = run["summary"]["diagnosis"]["left"]
    assert left[0]["rank"] == 1 and not left[0]["lost_peer"]
    # which peers saw the connection close before torchrun stopped them is timing (on a busy
    # machine one may be stopped first): at least one did, and no other rank is blamed
    victims = sorted(x["rank"] for x in left if x["lost_peer"])
    assert victims and set(victims) <= {0, 2}, left
    phrase = ("ranks 0, 2 lost their peer" if victims == [0, 2]
              else f"rank {victims[0]} lost its peer")
    # the stored error text leads the same way: the culprit's traceback before the victims
    err = run["error"]
    assert err.index("InjectedCrash") < err.index(phrase)
    assert err.count("closed by peer") == 1

    page.goto(f"{svc.url}/runs/{rid}")
    cause = page.locator("#run-health #run-cause")
    expect(cause).to_contain_text("rank 1 raised InjectedCrash")
    # the first line of the page under the title names the culprit: nothing above it but the
    # title bar, and it is the first red (alert or error) text of the page
    assert page.locator("#run-head > *").nth(1).get_attribute("id") == "run-health"
    assert page.locator("#run-health > *").first.get_attribute("id") == "run-cause"
    assert cause.inner_text().startswith("failed: rank 1 ")
    # its traceback first, open; the first traceback in the page is rank 1's
    tb = page.locator("#culprit-traceback")
    expect(tb).to_have_attribute("open", "")
    expect(tb.locator("pre")).to_contain_text("InjectedCrash")
    assert "InjectedCrash" in page.locator("pre").first.inner_text()
    # the victims after it, once, grouped
    lost = page.locator("#run-victims li", has_text="lost")
    expect(lost).to_have_count(1)
    expect(lost.first).to_contain_text(phrase)
    head = page.locator("#run-head").inner_text()
    assert head.count("closed by peer") == 1, head
    # measured in one script: a locator's bounding_box is None if the page redraws between
    # finding the element and measuring it
    tops = page.evaluate("""() => Object.fromEntries(["#run-cause", "#run-meta", "#cards"]
        .map((s) => [s, document.querySelector(s).getBoundingClientRect().top]))""")
    for box in ("#run-meta", "#cards"):
        assert tops["#run-cause"] < tops[box], (box, tops)
    # an ended run's head is drawn once: the log stream's end does not redraw it (that would
    # close a traceback the reader opened)
    tb.locator("summary").click()
    expect(tb).not_to_have_attribute("open", "")
    expect(page.locator("body")).to_have_attribute("data-log-end", "kept")
    expect(tb).not_to_have_attribute("open", "")
    # the tracebacks below (What went wrong) follow the same order
    expect(page.locator("#diagnosis-title")).to_have_text("What went wrong")
    expect(page.locator("#diagnosis-stacks details summary").first).to_have_text(
        "rank 1: traceback")
    # no emoji (drawn as boxes) anywhere in the page's text, the log's victims' lines included
    expect(page.locator("#log")).to_contain_text("Connection closed by peer")
    body = page.locator("body").inner_text()
    assert "GLHF!" in body and not EMOJI.search(body), EMOJI.findall(body)
    shot(page, "run-crashed-culprit-first")


def test_a_hung_run_shows_its_last_progress_before_the_verdict(svc, page):
    rid = svc.submit(HUNG)["id"]
    page.goto(f"{svc.url}/runs/{rid}")
    progress = page.locator("#run-progress")
    # while it still runs: the age of the last step line (step 2: rank 1 hangs in step 3) and
    # the countdown to the hang timeout, whose total is the spec's
    expect(progress).to_have_attribute("data-step", "2", timeout=120_000)
    text = progress.inner_text()
    assert re.search(r"last progress \d+ s ago \(step 2, rank \d\)", text), text
    countdown = page.locator("#hang-countdown")
    expect(countdown).to_have_attribute("data-total", str(HANG_S))
    expect(countdown).to_contain_text(f"runtime.hang_timeout_s = {HANG_S} s")
    assert 0 <= int(countdown.get_attribute("data-left")) <= HANG_S
    assert page.locator("#run-status .badge").inner_text() == "running"
    shot(page, "run-stalled-progress-age")
    # the age grows while nothing moves (read from the page, not the wall clock)
    first = float(progress.get_attribute("data-age-s"))
    wait_for(lambda: float(progress.get_attribute("data-age-s") or 0) > first, 10, "the age")

    # then the verdict: hung, the rank the others wait for, and how long it had stalled
    expect(page.locator("#run-status .badge")).to_have_text("hung", timeout=120_000)
    expect(page.locator("#run-cause")).to_contain_text("rank 1 never entered all_reduce",
                                                       timeout=90_000)
    expect(page.locator("#run-last-progress")).to_contain_text("step 2")
    expect(page.locator("#run-last-progress")).to_contain_text("before it was stopped")
    run = svc.run(rid)
    assert run["progress"]["kind"] == "step" and run["progress"]["step"] == 2
    assert run["progress"]["age_s"] >= HANG_S  # it stalled that long before the worker stopped it


def test_a_resumed_run_shares_the_step_axis_and_overlays_its_parent(svc, page):
    name = "base <i>run</i>"  # a name with markup: drawn as text in the legend
    pid = svc.submit({"preset": "ddp", "name": name, **TINY,
                      "train": {"steps": 6, "global_batch": 8, "checkpoint_every": 2}})["id"]
    _finished(svc, pid, "succeeded")
    r = svc.http.post(f"/api/runs/{pid}/resume", json={"step": 4})
    assert r.status_code == 201, r.text
    cid = r.json()["id"]
    child = _finished(svc, cid, "succeeded")
    assert child["summary"]["start_step"] == 4
    rows = svc.http.get(f"/api/runs/{cid}/metrics").json()["tables"]["throughput"]
    # one step numbering: the losses the run logged sit on its own (global) steps 4 and 5
    assert [r["step"] for r in rows if r["loss"] is not None] == [4, 5]
    assert [r["step"] for r in rows if r["step_s"] is not None] == [4, 5]

    page.goto(f"{svc.url}/runs/{cid}")
    page.wait_for_function("document.body.dataset.chartsReady === '1'")
    page.wait_for_function("document.querySelector('#loss-chart').data?.length === 2")
    charts = page.evaluate("""() => ['#loss-chart', '#throughput-chart'].map((s) => {
        const d = document.querySelector(s);
        return {traces: d.data.map((t) => ({name: t.name, x: Array.from(t.x),
                                            dash: t.line?.dash || null})),
                range: d.layout.xaxis.range};
    })""")
    loss, tput = charts
    own = next(t for t in loss["traces"] if t["name"] == "loss")
    step_time = next(t for t in tput["traces"] if t["name"] == "step time")
    assert own["x"] == step_time["x"] == [4, 5]
    assert loss["range"] == tput["range"]  # the same step range on both charts
    parent = next(t for t in loss["traces"] if t["name"] != "loss")
    assert parent["dash"] == "dash" and parent["x"] == [0, 1, 2, 3, 4, 5]
    expect(page.locator("#loss-chart .legendtext").first).to_have_text(f"parent {name}")
    # a run that succeeded: its lineage, not "What went wrong"
    expect(page.locator("#parent-link a")).to_have_attribute("href", f"/runs/{pid}")
    expect(page.locator("#diagnosis-title")).not_to_have_text("What went wrong")
    assert "What went wrong" not in page.locator("body").inner_text()
    expect(page.locator("#run-health")).to_contain_text("succeeded")
    assert page.locator("#run-error").inner_text() == ""
    shot(page, "run-resumed-parent-overlay")
