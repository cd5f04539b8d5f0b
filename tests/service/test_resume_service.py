"""Checkpoints, resume and automatic restart through the service (real backend, worker and
torchrun on gloo): only complete checkpoints are listed and accepted, a resumed run is linked
to its parent and continues its loss curve exactly (fp32, SGD: a wrong optimizer or data
position would show), a new layout reshards, and a run restarted by torchrun after a rank
failure shows each attempt. docs/checkpoints.md."""

from __future__ import annotations

import pytest

from tests.conftest import embedded_service, wait_for

pytestmark = pytest.mark.slow

MODEL = {"arch": "mlp", "hidden": 16, "layers": 2}
TRAIN = {"global_batch": 8, "optimizer": "sgd", "lr": 0.05}


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    yield from embedded_service(tmp_path_factory.mktemp("resume"))


def finished(svc, run_id, statuses=("succeeded",)):
    run = svc.wait_status(run_id, ("succeeded", "failed", "hung", "timed_out", "cancelled"),
                          240)
    assert run["status"] in statuses, run["error"]
    return wait_for(lambda: (r := svc.run(run_id))["summary"] is not None and r, 60,
                    f"the summary of {run_id}")


def submit(svc, preset, steps, **extra):
    return svc.submit({"preset": preset, "model": MODEL, "train": {**TRAIN, "steps": steps,
                                                                    **extra.pop("train", {})},
                       **extra})


def test_resume_continues_the_loss_curve_and_is_linked_to_its_parent(svc):
    full = submit(svc, "zero3", 6, train={"checkpoint_every": 2})
    full = finished(svc, full["id"])
    cps = svc.http.get(f"/api/runs/{full['id']}/checkpoints").json()
    assert [c["step"] for c in cps] == [2, 4]  # none after the last step
    assert cps[0]["strategy"] == "zero3" and "path" not in cps[0]

    r = svc.http.post(f"/api/runs/{full['id']}/resume", json={"step": 2})
    assert r.status_code == 201, r.text
    child = r.json()
    assert child["parent_id"] == full["id"]
    assert child["spec"]["resume"] == {"run_id": full["id"], "step": 2}
    assert child["name"].endswith("(resumed at 2)")
    child = finished(svc, child["id"])
    assert child["summary"]["start_step"] == 2
    want, got = full["summary"]["loss"][2:], child["summary"]["loss"]
    assert len(got) == 4 and all(abs(a - b) <= 1e-6 for a, b in zip(want, got, strict=True))
    log = svc.http.get(f"/api/runs/{child['id']}/logs").text
    assert f"downloading checkpoint step 2 of run {full['id']}" in log

    # onto another layout: ZeRO-3 dp=2 saved, DDP dp=2 and ZeRO-1 resumed (full tensors
    # by name: docs/checkpoints.md)
    r = svc.http.post(f"/api/runs/{full['id']}/resume",
                      json={"step": 4, "parallel": {"zero_stage": 1}})
    assert r.status_code == 201, r.text
    other = finished(svc, r.json()["id"])
    assert other["strategy"] == "zero1"
    assert all(abs(a - b) <= 1e-6 for a, b in zip(full["summary"]["loss"][4:],
                                                   other["summary"]["loss"], strict=True))


def test_resume_requests_that_cannot_be_honoured_are_422_naming_the_field(svc):
    run = finished(svc, submit(svc, "ddp", 4, train={"checkpoint_every": 2})["id"])
    r = svc.http.post(f"/api/runs/{run['id']}/resume", json={"step": 3})
    assert r.status_code == 422
    (e,) = r.json()["detail"]
    assert e["loc"] == ["body", "resume", "step"] and "complete checkpoints: 2" in e["msg"]
    r = svc.http.post(f"/api/runs/{run['id']}/resume", json={"model": {"hidden": 32}})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "model"]
    r = svc.http.post("/api/runs", json={"preset": "ddp", "model": {**MODEL, "hidden": 32},
                                         "resume": {"run_id": run["id"], "step": 2}})
    assert r.status_code == 422
    assert "model.hidden differs" in r.json()["detail"][0]["msg"]
    r = svc.http.post("/api/runs", json={"preset": "ddp", "resume": {"run_id": "nope",
                                                                      "step": 2}})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "resume", "run_id"]
    none = finished(svc, submit(svc, "ddp", 2)["id"])
    assert svc.http.get(f"/api/runs/{none['id']}/checkpoints").json() == []
    assert svc.http.post(f"/api/runs/{none['id']}/resume", json={}).status_code == 404


@pytest.fixture(scope="module")
def crashing(tmp_path_factory):
    """A service whose jobs' rank 1 dies (os._exit) after writing its shard of the step-4
    checkpoint, before the commit marker: a partial checkpoint, on attempt 0 only
    (PARALAB_TEST_CRASH_BEFORE_COMMIT, test-only, jobs/ckpt.py)."""
    yield from embedded_service(tmp_path_factory.mktemp("crash-save"),
                                {"PARALAB_TEST_CRASH_BEFORE_COMMIT": "4"})


def test_a_partial_checkpoint_is_never_offered_and_a_restart_resumes_the_last_complete(
        crashing):
    svc = crashing
    run = finished(svc, submit(svc, "ddp", 6, train={"checkpoint_every": 2})["id"],
                   ("failed",))
    assert [c["step"] for c in svc.http.get(f"/api/runs/{run['id']}/checkpoints").json()] \
        == [2]
    r = svc.http.post(f"/api/runs/{run['id']}/resume", json={"step": 4})
    assert r.status_code == 422 and "complete checkpoints: 2" in r.json()["detail"][0]["msg"]

    clean = finished(svc, submit(svc, "ddp", 6)["id"])
    again = finished(svc, submit(svc, "ddp", 6, train={"checkpoint_every": 2},
                                 runtime={"max_restarts": 1})["id"])
    tries = again["summary"]["attempts"]
    assert [t["attempt"] for t in tries] == [0, 1]
    assert tries[0]["cause"] and "rank 1" in tries[0]["cause"] and tries[1]["cause"] is None
    assert again["summary"]["start_step"] == 2  # the last complete checkpoint, not step 4
    assert all(abs(a - b) <= 1e-6 for a, b in zip(clean["summary"]["loss"][2:],
                                                   again["summary"]["loss"], strict=True))
