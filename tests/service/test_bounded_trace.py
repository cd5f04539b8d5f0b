"""Bounded tracing through the real service (backend + worker, embedded broker): a run with a
trace schedule is validated, predicted, run, and its analysis (what the run page draws) says
which steps were traced while every step keeps its loss and step time."""

from __future__ import annotations

import pytest

from tests.conftest import embedded_service

SPEC = {"preset": "ddp", "name": "bounded", "train": {"steps": 12},
        "trace": {"wait": 1, "warmup": 1, "active": 2, "repeat": 2}}


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    yield from embedded_service(tmp_path_factory.mktemp("bounded"))


def test_invalid_trace_section_is_refused_with_the_field(svc):
    r = svc.http.post("/api/runs", json={**SPEC, "trace": {"wait": 3}})
    assert r.status_code == 422, r.text
    errs = r.json()["detail"]
    assert any(e["loc"][-2:] == ["trace", "wait"] and "trace.active" in e["msg"]
               for e in errs), errs


def test_scheduled_run_predicted_run_and_analysed(svc):
    pred = svc.http.post("/api/predict", json=SPEC)
    assert pred.status_code == 200, pred.text
    t = pred.json()["trace"]
    assert t["traced_steps"] == "2-3,6-7" and t["steps"] == 12 and t["records"] > 0
    run = svc.submit(SPEC)
    done = svc.wait_status(run["id"], ("succeeded", "failed"), 180)
    assert done["status"] == "succeeded", done["error"]
    assert len(done["summary"]["loss"]) == 12
    m = svc.http.get(f"/api/runs/{run['id']}/metrics").json()
    assert m["run"]["traced_steps"] == t["traced_steps"]
    assert m["run"]["trace"]["steps"] == 12
    thr = m["tables"]["throughput"]
    assert [r["step"] for r in thr] == list(range(12))
    assert all(r["loss"] is not None and r["step_s"] for r in thr)
    assert {r["step"] for r in m["tables"]["step_rank"]} == {2, 3, 6, 7}


LONG = {"preset": "ddp", "name": "2000 steps, 3 windows of 5",
        "train": {"steps": 2000, "global_batch": 4},
        "trace": {"wait": 600, "warmup": 5, "active": 5, "repeat": 3}}
WINDOWS = [s for c in range(3) for s in range(c * 610 + 605, c * 610 + 610)]


def test_2000_steps_with_3_windows_of_5(svc):
    """Issue 19's acceptance: loss and step time for all 2,000 steps, detailed records for
    exactly the 15 scheduled steps; the run page's analysis, the Gantt and the Perfetto export
    (every step's scalars as counters) agree."""
    run = svc.submit(LONG)
    done = svc.wait_status(run["id"], ("succeeded", "failed"), 600)
    assert done["status"] == "succeeded", done["error"]
    assert len(done["summary"]["loss"]) == 2000
    m = svc.http.get(f"/api/runs/{run['id']}/metrics").json()
    assert m["run"]["traced_steps"] == "605-609,1215-1219,1825-1829"
    thr = m["tables"]["throughput"]
    assert [r["step"] for r in thr] == list(range(2000))
    assert all(r["loss"] is not None and r["step_s"] > 0 for r in thr)
    assert [r["step"] for r in thr if r["traced"]] == WINDOWS
    assert sorted({r["step"] for r in m["tables"]["step_rank"]}) == WINDOWS
    steps = svc.http.get(f"/api/runs/{run['id']}/gantt/steps").json()["steps"]
    assert [s["step"] for s in steps] == WINDOWS
    doc = svc.http.get(f"/api/runs/{run['id']}/export").json()
    ev = doc["traceEvents"]
    for rank in (0, 1):
        spans = sorted(e["args"]["step"] for e in ev if e["ph"] == "X" and e["pid"] == rank
                       and e["name"] == "step")
        assert spans == WINDOWS
        assert len([e for e in ev if e["pid"] == rank and e["name"] == "step scalars"]) == 2000


# no `trace` section: the default schedule, written out by hand (the first 20 steps, then the
# last 5 of every 100)
PLAIN = {"preset": "ddp", "name": "2000 steps, no trace section",
         "train": {"steps": 2000, "global_batch": 4}}
DEFAULT_STEPS = list(range(20)) + [s for base in range(0, 2000, 100)
                                   for s in range(base + 95, base + 100)]


def test_a_run_without_a_trace_section_stores_a_bounded_trace(svc):
    """A 2,000-step run submitted with no `trace` section traces 120 steps in detail and
    keeps every step's loss and step time; the form's prediction and the run's analysis state
    the schedule; tracing every step is the explicit `steps: "all"`."""
    pred = svc.http.post("/api/predict", json=PLAIN).json()["trace"]
    assert pred["traced_step_count"] == 120 and pred["max_records"] == 500_000
    assert pred["schedule"].startswith("default: the first 20 steps, then 5 in every 100")
    every = svc.http.post("/api/predict", json={**PLAIN, "trace": {"steps": "all"}}).json()
    assert every["trace"]["traced_step_count"] == 2000 and every["trace"]["max_records"] == 0
    run = svc.submit(PLAIN)
    done = svc.wait_status(run["id"], ("succeeded", "failed"), 600)
    assert done["status"] == "succeeded", done["error"]
    assert len(done["summary"]["loss"]) == 2000
    m = svc.http.get(f"/api/runs/{run['id']}/metrics").json()
    assert m["run"]["trace"]["schedule"] == pred["schedule"]
    thr = m["tables"]["throughput"]
    assert [r["step"] for r in thr] == list(range(2000))
    assert all(r["loss"] is not None and r["step_s"] > 0 for r in thr)
    assert [r["step"] for r in thr if r["traced"]] == DEFAULT_STEPS
    assert sorted({r["step"] for r in m["tables"]["step_rank"]}) == DEFAULT_STEPS
