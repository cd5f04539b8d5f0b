"""Compare says which run is better (issue 37 item 7), in Chromium: a verdict per figure
(better / worse / same within noise, coloured, naming the runs), deltas worded per figure
("+13.3 ms (14.2×)" for exposed comm, not "slower"), step ranges labelled by run, and an
unknown id named inline while the other runs still compare.

The runs are real (queued on a queue no worker serves, so they cost nothing); their analyses
(GET /api/runs/{id}/metrics) are served by the test, so the figures and their per-step spread
are known exactly."""

from __future__ import annotations

import json

import pytest
from playwright.sync_api import expect

from tests.conftest import backend_only_service
from tests.frontend.browser import shot

EVIL = "<img src=x onerror=alert(7)>"


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    yield from backend_only_service(tmp_path_factory.mktemp("compare-verdict"))


def analysis(steps: list[float], exposed: float, peak: int, loss0: float) -> dict:
    """An analysis with a throughput row per step (step 0 warm-up) and step_rank rows."""
    tokens = 1024
    thr = [{"step": i, "step_s": s, "tokens": tokens, "tokens_per_s": tokens / s,
            "loss": loss0 - 0.01 * i, "traced": True} for i, s in enumerate(steps)]
    sr = [{"step": i, "rank": r, "exposed_comm_s": exposed * (1 + 0.01 * (i % 2))}
          for i in range(len(steps)) for r in (0, 1)]
    steady = sorted(steps[1:])
    med = steady[len(steady) // 2] if len(steady) % 2 else sum(
        steady[len(steady) // 2 - 1:len(steady) // 2 + 1]) / 2
    return {"headline": {"steady_steps": [1, len(steps) - 1], "step_time_s": med,
                         "tokens_per_s": tokens / med, "peak_memory_bytes": peak,
                         "exposed_comm_s": exposed * 1.005, "comm_bytes_per_rank": 4e6,
                         "bubble_fraction": None, "overlap_pct": 40.0},
            "tables": {"throughput": thr, "step_rank": sr}}


@pytest.fixture(scope="module")
def runs(svc) -> dict:
    out = {}
    for key, preset in (("a", "ddp"), ("b", "zero2")):
        r = svc.http.post("/api/runs", json={"preset": preset, "name": f"{EVIL} {key}",
                                             "runtime": {"queue": "nobody"}})
        assert r.status_code == 201, r.text
        out[key] = r.json()
    # a: 50 ms steps, 1 ms exposed comm; b: 30 ms steps (faster beyond a ±1 ms spread),
    # 14.2 ms exposed comm (14.2x a's), the same peak memory; b has two more steps
    out["metrics"] = {
        out["a"]["id"]: analysis([0.2, 0.050, 0.051, 0.049, 0.050], 0.001, 272_000, 2.0),
        out["b"]["id"]: analysis([0.3, 0.030, 0.031, 0.029, 0.030, 0.0305, 0.0295], 0.0142,
                                 272_000, 2.0)}
    return out


def serve_metrics(page, metrics: dict) -> None:
    def handle(route):
        rid = route.request.url.split("/api/runs/")[1].split("/")[0]
        if rid in metrics:
            route.fulfill(status=200, content_type="application/json",
                          body=json.dumps(metrics[rid]))
        else:
            route.fulfill(status=404, content_type="application/json",
                          body=json.dumps({"detail": "no analysis"}))
    page.route("**/api/runs/*/metrics", handle)


def verdict(page, figure: str):
    return page.locator(f"#cmp-table tr[data-figure='{figure}'] .verdict")


def test_compare_opens_with_a_verdict_per_figure(svc, runs, page):
    a, b = runs["a"], runs["b"]
    serve_metrics(page, runs["metrics"])
    page.goto(f"{svc.url}/compare?ids={a['id']},{b['id']}")
    step = verdict(page, "step_time_s")
    expect(step).to_have_count(1)
    # b is faster, beyond the runs' own per-step spread: b is named the better run
    expect(step).to_have_attribute("data-verdict", "better")
    expect(step).to_have_attribute("data-winner", b["id"])
    expect(step).to_have_class("verdict better")
    expect(step).to_contain_text(f"{EVIL} b ({b['id']}) better than {EVIL} a ({a['id']})")
    assert "IQR" in step.get_attribute("title")
    expect(verdict(page, "tokens_per_s")).to_have_attribute("data-winner", b["id"])
    # exposed comm: b is worse, a the better one; the delta is an amount and a ratio
    comm = verdict(page, "exposed_comm_s")
    expect(comm).to_have_attribute("data-verdict", "worse")
    expect(comm).to_have_attribute("data-winner", a["id"])
    expect(comm).to_have_class("verdict worse")
    cell = page.locator("#cmp-table tr[data-figure='exposed_comm_s'] td.num").nth(1)
    expect(cell.locator(".delta")).to_have_text("+13.3 ms (14.2×)")
    expect(cell.locator(".delta")).to_have_class("delta bad")
    # equal peaks: the same, no colour on the delta
    mem = verdict(page, "peak_memory_bytes")
    expect(mem).to_have_attribute("data-verdict", "same")
    expect(mem).to_contain_text("within noise")
    mem_delta = page.locator("#cmp-table tr[data-figure='peak_memory_bytes'] td.num").nth(1)
    assert mem_delta.locator(".delta").get_attribute("class").split() == ["delta"]
    # the colours differ: green for better, red for worse, grey for the same
    colors = [loc.evaluate("e => getComputedStyle(e).backgroundColor")
              for loc in (step, comm, mem)]
    assert len(set(colors)) == 3 and "rgba(0, 0, 0, 0)" not in colors
    step_delta = page.locator("#cmp-table tr[data-figure='step_time_s'] td.num").nth(1)
    expect(step_delta.locator(".delta")).to_have_class("delta good")
    # step ranges are attributed to each run
    expect(page.locator(f"#cmp-table th[data-run='{a['id']}'] .steps")).to_have_text("steps 1–4")
    expect(page.locator(f"#cmp-table th[data-run='{b['id']}'] .steps")).to_have_text("steps 1–6")
    expect(page.locator("#cmp-caption")).to_contain_text(f"{EVIL} b: steps 1–6")
    expect(page.locator("#cmp-noise")).to_contain_text("interquartile range")
    assert page.locator("main img").count() == 0
    shot(page, "compare-verdict")
    # b as the baseline: a is now the worse one on step time
    page.select_option("#cmp-base", "1")
    expect(step).to_have_attribute("data-run", a["id"])
    expect(step).to_have_attribute("data-verdict", "worse")
    expect(step).to_have_attribute("data-winner", b["id"])


def test_an_unknown_id_is_named_inline_and_the_others_still_compare(svc, runs, page):
    a, b = runs["a"], runs["b"]
    serve_metrics(page, runs["metrics"])
    page.goto(f"{svc.url}/compare?ids={a['id']},nosuchrun,{b['id']}")
    bad = page.locator("#compare-error [data-bad-id='nosuchrun']")
    expect(bad).to_have_text("nosuchrun: no such run")
    expect(verdict(page, "step_time_s")).to_have_attribute("data-winner", b["id"])
    expect(page.locator("#cmp-table thead th.num")).to_have_count(2)
    expect(page.locator("#config-diff tr.diff").first).to_be_visible()
    # an id that is markup is shown as text; one good run alone is said to need another
    page.goto(f"{svc.url}/compare?ids={a['id']},{EVIL}")
    expect(page.locator("#compare-error .bad-id")).to_have_count(1)
    expect(page.locator("#compare-error")).to_contain_text("pick at least one more run")
    assert page.locator("main img").count() == 0
