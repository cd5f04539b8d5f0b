"""The dashboard in a real browser against the real service (issue 7 acceptance).

One module-scoped service and Chromium serve every test; runs that only need a spec (compare,
escaping, cancel) go to a queue no worker serves, so they stay queued and cost nothing. Every
wait is on a condition with a generous timeout: the machine may be busy."""

from __future__ import annotations

import json
import secrets

import httpx
import pytest
from playwright.sync_api import expect

from tests.frontend.browser import shot

RUN_DONE_S = 240  # a 2- or 4-rank torchrun job on a loaded 2-core machine
EVIL = "<img src=x onerror=alert(1)>"


@pytest.fixture(scope="module")
def pp_run(svc):
    """A 4-rank pipeline run (1F1B, 4 micro-batches), submitted first so it runs while the
    other tests start."""
    run = svc.submit({"preset": "pp-1f1b", "name": "pp4 gantt", "train": {"steps": 3},
                      "parallel": {"pp": 4, "microbatches": 4},
                      "runtime": {"nproc_per_node": 4}})
    return run["id"]


@pytest.fixture(scope="module")
def idle_queue():
    return f"nobody-{secrets.token_hex(3)}"


def queued(svc, idle_queue, body: dict) -> dict:
    body = {**body, "runtime": {**body.get("runtime", {}), "queue": idle_queue}}
    r = svc.http.post("/api/runs", json=body)
    assert r.status_code == 201, r.text
    return r.json()


def trace_records(svc, run_id: str) -> list[dict]:
    out = []
    for path in sorted((svc.tmp / "var" / "runs" / run_id).glob("trace-rank*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def drawn(rec: dict) -> bool:
    """What the Gantt draws: every span but the step envelope, and every comm op."""
    return (rec["type"] == "span" and rec.get("cat") != "step") or rec["type"] == "comm"


def test_submit_from_form_reaches_succeeded_live(svc, pp_run, page):
    page.goto(f"{svc.url}/new?preset=ddp")
    expect(page.locator("#f-parallel-dp")).to_have_value("2")
    page.fill("#name", "from the form")
    page.fill("#f-train-steps", "3")
    page.fill("#f-runtime-queue", svc.queue)  # the GPU host: this service's worker
    page.wait_for_selector("#pred-memory[data-ready='1']")
    expect(page.locator("[data-card='peak memory per rank'] .value")).not_to_have_text("")
    # An invalid combination is explained inline and blocks submit ...
    page.fill("#f-parallel-dp", "3")
    expect(page.locator("[data-section-msg='parallel']")).to_contain_text("dp*tp*pp")
    expect(page.locator("#submit")).to_be_disabled()
    shot(page, "new-run-invalid")
    # ... and fixing it clears the message.
    page.fill("#f-parallel-dp", "2")
    expect(page.locator("#submit")).to_be_enabled()
    expect(page.locator("[data-section-msg='parallel']")).to_have_text("")
    # a field's own error: announced with the field (aria-invalid, the message describes it)
    page.fill("#f-train-steps", "0")
    steps = page.locator("#f-train-steps")
    expect(steps).to_have_attribute("aria-invalid", "true")
    expect(page.locator(f"#{steps.get_attribute('aria-describedby')}")).not_to_have_text("")
    page.fill("#f-train-steps", "3")
    expect(steps).to_have_attribute("aria-invalid", "false")
    page.wait_for_selector("#pred-formulas tbody tr")
    # per link (one host: the dp all-reduce stays intra-host, at its bus bandwidth)
    expect(page.locator("#pred-links tbody tr[data-axis='dp'][data-link='intra']")).to_have_count(1)
    # a what-if of two hosts moves the dp all-reduce onto the inter-host link; the spec (one
    # host) stays submittable, and an impossible what-if is explained without blocking submit
    page.fill("#whatif-nnodes", "2")
    expect(page.locator("#pred-links tbody tr[data-axis='dp'][data-link='inter']")).to_have_count(1)
    expect(page.locator("#pred-links-caption")).to_contain_text("2 hosts")
    expect(page.locator("#submit")).to_be_enabled()
    page.fill("#whatif-nnodes", "3")
    expect(page.locator("#pred-status")).to_contain_text("what-if: nnodes")
    expect(page.locator("#submit")).to_be_enabled()
    page.fill("#whatif-nnodes", "")
    expect(page.locator("#pred-links tbody tr[data-axis='dp'][data-link='intra']")).to_have_count(1)
    shot(page, "new-run")
    page.click("#submit")
    page.wait_for_function("() => location.pathname.startsWith('/runs/') || "
                           "document.getElementById('form-error')?.textContent")
    assert "/runs/" in page.url, page.locator("#form-error").text_content()
    run_id = page.url.rstrip("/").split("/")[-1]
    status = page.locator("#run-status [data-status]")
    expect(status).to_have_count(1)
    first = status.get_attribute("data-status")
    assert first in ("queued", "running")  # the pp run is ahead of it: seen live, not reloaded
    expect(status).to_have_text("succeeded", timeout=RUN_DONE_S * 1000)
    assert svc.run(run_id)["status"] == "succeeded"
    assert svc.run(run_id)["spec"]["runtime"]["queue"] == svc.queue
    expect(page.locator("#log")).to_contain_text("step", timeout=30_000)
    page.wait_for_selector("body[data-charts-ready='1']", timeout=60_000)

    # Memory: measured and predicted for every rank.
    page.wait_for_selector("#memory-chart[data-ready='1']")
    traces = page.evaluate("""() => document.getElementById('memory-chart').data.map(
        t => ({x: t.x, y: t.y}))""")
    seen = {}
    for t in traces:
        for rank, kind, y in zip(t["x"][0], t["x"][1], t["y"], strict=True):
            seen[(rank, kind)] = seen.get((rank, kind), 0) + y
    for r in range(2):
        assert seen.get((f"rank {r}", "measured"), 0) > 0, seen
        assert seen.get((f"rank {r}", "predicted"), 0) > 0, seen
    expect(page.locator("#memory-table tbody tr")).not_to_have_count(0)
    # the per-link table next to the per-axis chart: the dp bytes, measured on the one host
    dp_link = page.locator("#comm-links tbody tr[data-axis='dp'][data-link='intra']")
    expect(dp_link).to_have_count(1)
    expect(page.locator("#comm-links tbody tr[data-link='inter']")).to_have_count(0)
    page.wait_for_selector("#gantt[data-ready='1']")
    assert page.locator("#gantt").get_attribute("data-rows") == "2"
    shot(page, "run-ddp")


def test_pipeline_gantt_has_a_row_per_rank_and_every_span(svc, pp_run, page):
    svc.wait_status(pp_run, "succeeded", RUN_DONE_S)
    records = [r for r in trace_records(svc, pp_run) if drawn(r)]
    assert records
    page.goto(f"{svc.url}/runs/{pp_run}")
    gantt = page.locator("#gantt")
    expect(gantt).to_have_attribute("data-ready", "1")
    step = int(page.locator("#gantt-step").input_value())  # a pipeline run opens on one step
    expected = sum(1 for r in records if r.get("step") == step)
    expect(gantt).to_have_attribute("data-rows", "4")
    expect(gantt).to_have_attribute("data-theory-rows", "4")  # the simulated schedule
    expect(gantt).to_have_attribute("data-total-spans", str(expected))
    expect(gantt).to_have_attribute("data-segments", str(expected))  # no merging at this size
    segs = page.evaluate("""() => document.getElementById('gantt').data
        .filter(t => t.name !== 'idle' && t.meta !== 'theory')
        .reduce((n, t) => n + t.x.filter(v => v === null).length, 0)""")
    assert segs == expected
    labels = page.evaluate("() => document.getElementById('gantt').layout.yaxis.ticktext")
    # one lane per rank and channel: the compute lane names the rank, the others their channel
    named = [x.split(" ")[:2] for x in labels if x.startswith("rank ")]
    assert named == [["rank", str(r)] for r in range(4)]
    shot(page, "run-pp4-gantt")
    page.select_option("#gantt-step", "")
    expect(gantt).to_have_attribute("data-total-spans", str(len(records)))
    expect(gantt).to_have_attribute("data-theory-rows", "0")
    page.wait_for_selector("#comm-overlap[data-ready='1']")
    shot(page, "run-pp4")


def test_compare_highlights_differing_fields(svc, idle_queue, page):
    a = queued(svc, idle_queue, {"preset": "ddp", "name": "cmp ddp"})
    b = queued(svc, idle_queue, {"preset": "zero2", "name": "cmp zero2",
                                 "parallel": {"bucket_mb": 5}})
    page.goto(f"{svc.url}/compare?ids={a['id']},{b['id']}")
    page.wait_for_selector("#config-diff tr.diff")
    # the key figures lead; the config diff comes last
    order = page.evaluate("""() => [...document.querySelectorAll('main table, main .chart')]
        .map(e => e.id)""")
    assert order[0] == "cmp-table" and order[-1] == "config-diff", order
    differing = page.eval_on_selector_all("#config-diff tr.diff",
                                          "rs => rs.map(r => r.dataset.field)")
    assert {"parallel.zero_stage", "parallel.bucket_mb", "strategy", "name"} <= set(differing)
    assert "model.hidden" not in differing
    page.check("#show-all")
    same = page.locator("#config-diff tr[data-field='model.hidden']")
    expect(same).to_have_attribute("data-differs", "false")
    expect(same).not_to_have_class("diff")
    shot(page, "compare")


def test_user_strings_are_shown_as_text(svc, idle_queue, page):
    run = queued(svc, idle_queue, {"preset": "ddp", "name": EVIL, "tags": ["<b>t</b>"],
                                   "notes": "<script>alert(2)</script>"})
    page.goto(f"{svc.url}/?q={run['id']}")
    row = page.locator(f"#runs tr[data-run-id='{run['id']}']")
    expect(row.locator(".run-name")).to_have_text(EVIL)
    expect(row.locator(".tag")).to_have_text("<b>t</b>")
    assert page.locator("#runs img, #runs b").count() == 0
    shot(page, "runs-escaped")
    page.goto(f"{svc.url}/runs/{run['id']}")
    expect(page.locator("#run-title")).to_have_text(EVIL)
    assert page.locator("main img").count() == 0
    other = queued(svc, idle_queue, {"preset": "ddp", "name": "plain"})
    page.goto(f"{svc.url}/compare?ids={run['id']},{other['id']}")
    page.wait_for_selector("#config-diff tr.diff")
    expect(page.locator("#cmp-table thead a").first).to_have_text(f"{EVIL} ({run['id']})")
    assert page.locator("main img").count() == 0


def test_runs_list_filters_pages_and_cancels(svc, idle_queue, page):
    tag = f"t{secrets.token_hex(3)}"
    ids = [queued(svc, idle_queue, {"preset": "ddp", "name": f"list {i}", "tags": [tag]})["id"]
           for i in range(3)]
    page.goto(f"{svc.url}/?tag={tag}&limit=25")
    expect(page.locator("#runs tbody tr")).to_have_count(3)
    # sorted by name, ascending
    page.goto(f"{svc.url}/?tag={tag}&sort=name")
    expect(page.locator("#runs tbody tr .run-name")).to_have_text(["list 0", "list 1", "list 2"])
    # select two runs: the compare link carries them
    page.locator(f"tr[data-run-id='{ids[0]}'] input.pick").check()
    page.locator(f"tr[data-run-id='{ids[1]}'] input.pick").check()
    expect(page.locator("#compare-btn")).to_be_enabled()
    shot(page, "runs")
    # cancel from the list (asked to confirm)
    page.allowed_dialogs.append("Cancel run")
    page.locator(f"tr[data-run-id='{ids[2]}'] button.cancel").click()
    expect(page.locator(f"tr[data-run-id='{ids[2]}']")).to_have_attribute(
        "data-status", "cancelled")
    page.click("#compare-btn")
    page.wait_for_url(f"**/compare?ids={ids[0]},{ids[1]}")


def finished_with(svc, run_id: str, headline: dict) -> None:
    """Report a run through the worker channel, as a worker with this analysis would."""
    auth = {"Authorization": f"Bearer {svc.env['PARALAB_WORKER_TOKEN']}"}
    svc.http.post(f"/api/internal/runs/{run_id}/claim", headers=auth,
                  json={"worker": "test", "task_id": None}).raise_for_status()
    svc.http.post(f"/api/internal/runs/{run_id}/finish", headers=auth,
                  json={"status": "succeeded", "exit_code": 0,
                        "summary": {"headline": headline}}).raise_for_status()


def test_runs_list_sorts_and_filters_by_key_figures(svc, idle_queue, page):
    tag = f"m{secrets.token_hex(3)}"
    figures = [(0.030, 3e6), (0.010, 1e6), (0.020, 5e6)]
    ids = []
    for i, (t, mem) in enumerate(figures):
        rid = queued(svc, idle_queue, {"preset": "ddp", "name": f"fig {i}", "tags": [tag]})["id"]
        finished_with(svc, rid, {"step_time_s": t, "peak_memory_bytes": mem,
                                 "tokens_per_s": 1 / t, "final_loss": 1.5})
        ids.append(rid)
    page.goto(f"{svc.url}/?tag={tag}")
    rows = page.locator("#runs tbody tr .run-name")
    expect(rows).to_have_count(3)
    page.click("th[data-sort='step_time_s']")  # first click: descending
    expect(rows).to_have_text(["fig 0", "fig 2", "fig 1"])
    page.click("th[data-sort='step_time_s']")
    expect(rows).to_have_text(["fig 1", "fig 2", "fig 0"])
    assert "sort=step_time_s" in page.url
    expect(page.locator(f"tr[data-run-id='{ids[1]}'] td.num").first).to_have_text("10.0 ms")
    page.fill("#f-mem-max", "lots")
    page.click("#filters button[type='submit']")
    expect(page.locator("#f-mem-max")).to_have_attribute("aria-invalid", "true")
    expect(page.locator("#list-error")).to_contain_text("peak mem")
    page.fill("#f-mem-max", "3 MB")
    page.click("#filters button[type='submit']")
    expect(rows).to_have_text(["fig 1", "fig 0"])
    expect(page.locator("#f-mem-max")).to_have_attribute("aria-invalid", "false")
    assert "max_peak_memory_bytes=3000000" in page.url
    shot(page, "runs-by-figures")


def test_collectives_page_overlays_sweeps(svc, idle_queue, page):
    auth = {"Authorization": f"Bearer {svc.env['PARALAB_WORKER_TOKEN']}"}
    for scale in (1.0, 2.0):
        run = queued(svc, idle_queue, {"preset": "collective-sweep", "name": f"sweep x{scale}"})
        rid = run["id"]
        assert svc.http.post(f"/api/internal/runs/{rid}/claim", json={"worker": "t"},
                             headers=auth).json()["launch"]
        results = [{"op": op, "algorithm": alg, "bytes": b, "time_us_mean": b / 1e3 / scale,
                    "algbw_GBps": scale * b / 1e6, "busbw_GBps": scale * b / 1e6,
                    "correct": True}
                   for op, alg in (("all_reduce", "ring"), ("all_reduce", "builtin"))
                   for b in (1024, 4096, 16384, 65536)]
        summary = {"kind": "collective_bench", "backend": "gloo", "device": "cpu",
                   "copy_bandwidth_GBps": 3.0, "results": results}
        r = svc.http.post(f"/api/internal/runs/{rid}/finish", headers=auth,
                          json={"status": "succeeded", "exit_code": 0, "summary": summary})
        assert r.json()["status"] == "succeeded"
    page.goto(f"{svc.url}/collectives")
    chart = page.locator("#coll-chart")
    expect(chart).to_have_attribute("data-ready", "1")
    expect(chart).to_have_attribute("data-sweeps", "2")
    n = page.evaluate("() => document.getElementById('coll-chart').data.length")
    assert n == 4  # 2 sweeps x (all_reduce/ring, all_reduce/builtin)
    shot(page, "collectives")


def test_pages_and_vendored_plotly_are_served(svc, idle_queue):
    rid = queued(svc, idle_queue, {"preset": "ddp", "name": "page"})["id"]
    assert httpx.get(f"{svc.url}/runs/nosuchrun").status_code == 404
    for path in ("/", "/new", "/compare", "/collectives", "/schedules", f"/runs/{rid}"):
        r = httpx.get(svc.url + path)
        assert r.status_code == 200 and '<main id="content"' in r.text, path
    r = httpx.get(svc.url + "/static/vendor/plotly.min.js")
    assert r.status_code == 200 and "plotly.js" in r.text[:300]
