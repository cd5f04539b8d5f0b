"""One source for every number (issue 12 acceptance): real runs through the service (a 4-rank
1F1B pipeline, 2-rank DDP and ZeRO-3), and every figure the run page's endpoints return equals
the cell of the run's exported tables under the same name; the page's cards, the timeline
header and the compare page show those same values.

A tolerance never enters: the exported JSON and the endpoint come from one analysis; CSV
cells are the same numbers printed by Python's repr."""

from __future__ import annotations

import csv
import io
import json

import pytest
from playwright.sync_api import expect

from jobs.analysis import TABLES
from jobs.analysis.labels import csv_header
from tests.frontend.browser import shot

RUN_DONE_S = 300
STEPS = 4


@pytest.fixture(scope="module")
def runs(svc):
    ids = {
        "pp": svc.submit({"preset": "pp-1f1b", "name": "figures pp4",
                          "train": {"steps": STEPS, "global_batch": 8},
                          "parallel": {"pp": 4, "microbatches": 4},
                          "model": {"layers": 4}, "runtime": {"nproc_per_node": 4}})["id"],
        "ddp": svc.submit({"preset": "ddp", "name": "figures ddp",
                           "train": {"steps": STEPS}})["id"],
        "zero3": svc.submit({"preset": "zero3", "name": "figures zero3",
                             "train": {"steps": STEPS}})["id"],
    }
    for rid in ids.values():
        assert svc.wait_status(rid, ("succeeded", "failed"), RUN_DONE_S)["status"] == "succeeded"
    return ids


def cell(v) -> str:
    """What the CSV writer prints for a JSON value."""
    if v is None:
        return ""
    if isinstance(v, dict | list):
        return json.dumps(v, separators=(",", ":"))
    if isinstance(v, bool):
        return str(v)
    return str(v)


def test_endpoint_figures_equal_the_exported_tables(svc, runs):
    for kind, rid in runs.items():
        m = svc.http.get(f"/api/runs/{rid}/metrics").json()
        assert "partial" not in m, kind  # the stored analysis of a finished run
        assert list(m["tables"]) == list(TABLES)
        assert m["tables"]["headline"] == [m["headline"]]
        full = svc.http.get(f"/api/runs/{rid}/export", params={"format": "json"}).json()
        assert full == {k: v for k, v in m.items() if k != "bandwidth_vs_sweep"}, kind
        for name in TABLES:
            rows = m["tables"][name]
            js = svc.http.get(f"/api/runs/{rid}/export",
                              params={"format": "json", "table": name}).json()
            assert js == rows, (kind, name)
            one = svc.http.get(f"/api/runs/{rid}/metrics", params={"table": name}).json()
            assert one["rows"] == rows and one["total"] == len(rows), (kind, name)
            text = svc.http.get(f"/api/runs/{rid}/export",
                                params={"format": "csv", "table": name}).text
            got = list(csv.DictReader(io.StringIO(text)))
            assert len(got) == len(rows), (kind, name)
            unit = m["headline"]["throughput_unit"]  # the header names the unit (issue 37)
            for want, row in zip(rows, got, strict=True):
                for k, v in want.items():
                    h = csv_header(name, [k], unit)[0]
                    assert row[h] == cell(v), (kind, name, k, row[h], v)
        h = m["headline"]
        assert h["steady_steps"] == [1, STEPS - 1]
        thr = {r["step"]: r["step_s"] for r in m["tables"]["throughput"]}
        assert h["step_time_s"] == sorted(thr[s] for s in (1, 2, 3))[1]  # median of steps 1-3
        # the job's own step times (its log lines) are the slowest rank's step spans
        summary = svc.run(rid)["summary"]
        assert [round(t, 9) for t in summary["step_time_s"]] == \
            [round(thr[s], 9) for s in range(STEPS)], kind
        # overlap is defined once: the ranks table and the headline agree with step_rank
        use = [r for r in m["tables"]["step_rank"] if r["step"] >= 1]
        comm = sum(r["comm_s"] for r in use)
        assert h["overlap_pct"] == pytest.approx(100 * sum(r["overlap_s"] for r in use) / comm)
        for r in use:
            parts = r["compute_s"] + r["exposed_comm_s"] + (r["bubble_s"] or 0) + r["idle_s"]
            assert parts == pytest.approx(r["step_s"], rel=1e-9)
        s = h["straggler_rank"]
        if s is not None:  # named only when flagged in at least half of the steady steps
            flagged = [r for r in m["tables"]["stragglers"] if r["step"] >= 1 and r["flagged"]]
            assert 2 * sum(r["rank"] == s for r in flagged) >= STEPS - 1


def test_blocking_zero3_gathers_are_never_compute(svc, runs):
    m = svc.http.get(f"/api/runs/{runs['zero3']}/metrics").json()
    gathers = [r for r in m["tables"]["collectives"] if r["op"] == "all_gather" and r["step"] >= 1]
    assert gathers
    for r in m["tables"]["step_rank"]:
        if r["step"] >= 1:
            # every synchronous all-gather sits inside forward / backward: it is exposed comm
            assert r["overlap_pct"] == pytest.approx(0.0, abs=1e-9)
            assert r["exposed_comm_s"] == pytest.approx(r["comm_s"])
    assert m["headline"]["overlap_pct"] == pytest.approx(0.0, abs=1e-9)


def test_pipeline_bubble_is_one_figure_per_convention(svc, runs):
    rid = runs["pp"]
    m = svc.http.get(f"/api/runs/{rid}/metrics").json()
    h, stages = m["headline"], m["tables"]["stage_bubbles"]
    assert [r["stage"] for r in stages] == [0, 1, 2, 3]
    assert h["bubble_fraction"] == pytest.approx(
        sum(r["measured_idle_fraction"] for r in stages) / 4, rel=1e-12)
    assert h["bubble_simulated_fraction"] == pytest.approx(
        sum(r["simulated"] for r in stages) / 4, rel=1e-12)
    assert h["bubble_closed_form"] == pytest.approx(3 / 7)
    assert h["predicted_bubble_fraction"] == pytest.approx(3 / 7)
    g = svc.http.get(f"/api/runs/{rid}/gantt", params={"step": 2}).json()
    assert g["theory"]["bubble_fraction"] == h["bubble_simulated_fraction"]


def test_the_pages_show_the_analysis_values(svc, runs, page):
    for kind, rid in runs.items():
        h = svc.http.get(f"/api/runs/{rid}/metrics").json()["headline"]
        page.goto(f"{svc.url}/runs/{rid}")
        page.wait_for_selector("body[data-charts-ready='1']")
        for key in ("step_time_s", "tokens_per_s", "peak_memory_bytes", "bubble_fraction",
                    "overlap_pct", "exposed_comm_s", "straggler_rank"):
            got = page.locator(f"#cards [data-key='{key}']").get_attribute("data-value")
            want = "" if h[key] is None else h[key]
            assert got == ("" if want == "" else str(want)) or float(got) == want, (kind, key)
        expect(page.locator("#cards [data-key='step_time_s'] .sub")).to_have_text(
            "median of steps 1–3")
        if kind == "pp":
            gantt = page.locator("#gantt")
            expect(gantt).to_have_attribute("data-ready", "1")
            assert float(gantt.get_attribute("data-simulated-bubble")) == \
                h["bubble_simulated_fraction"]
            info = page.locator("#gantt-info").text_content()
            assert f"measured {h['bubble_fraction'] * 100:.1f} %" in info
            assert f"simulated {h['bubble_simulated_fraction'] * 100:.1f} %" in info
            shot(page, "run-figures-pp4")
    ids = [runs["pp"], runs["ddp"]]
    page.goto(f"{svc.url}/compare?ids={','.join(ids)}")
    page.wait_for_selector("body[data-charts-ready='1']")
    for i, rid in enumerate(ids):
        h = svc.http.get(f"/api/runs/{rid}/metrics").json()["headline"]
        for key, scale in (("step_time_s", 1), ("tokens_per_s", 1), ("exposed_comm_s", 1),
                           ("peak_memory_bytes", 1), ("bubble_fraction", 100)):
            row = page.locator(f"#cmp-table tr[data-figure='{key}']")
            if h[key] is None:
                continue
            got = row.locator("td.num").nth(i).get_attribute("data-value")
            assert float(got) == pytest.approx(h[key] * scale, rel=1e-12), (rid, key)
    # the timelines: a row per rank of each run (4 + 2), compute drawn on every row
    lay = page.evaluate("() => document.getElementById('cmp-timelines').layout.yaxis")
    assert len(lay["ticktext"]) == 6
    rows = page.evaluate("""() => document.getElementById('cmp-timelines').data
        .filter(t => t.name.endsWith('compute')).flatMap(t => t.y.filter(v => v !== null))""")
    assert sorted(set(rows)) == sorted(lay["tickvals"])
    # a 4-step run's step axes are labelled with whole steps (no "0.5, 1.5")
    for chart in ("cmp-steps", "cmp-loss"):
        ticks = page.eval_on_selector_all(f"#{chart} .xtick text",
                                          "ts => ts.map(t => t.textContent)")
        assert ticks and all(t.isdigit() for t in ticks), (chart, ticks)
    shot(page, "compare-figures")
