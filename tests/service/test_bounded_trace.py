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
