"""Runs that go wrong, through the service (real backend, real worker, real torchrun on gloo):
each injected fault kind ends in the state it should, no process of the run is left, and the
stored diagnosis names the rank, group, op and position (or the straggler). docs/faults.md.

One embedded service for the module; each run is small (2 ranks, a few steps) and the hung
ones use a short runtime.hang_timeout_s."""

from __future__ import annotations

import time

import pytest

from tests.conftest import embedded_service, pids_with_run_id

pytestmark = pytest.mark.slow

HANG_S = 4.0  # runtime.hang_timeout_s of the runs that hang (or may: a skip, a mismatch)
SAFETY_S = 60.0  # ... of the runs that end by themselves: a safety net only, so a slow exit
# on a loaded machine is never mistaken for a hang (the watch is a wall clock)


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    yield from embedded_service(tmp_path_factory.mktemp("faults"))


def run_with(svc, fault: dict, *, preset: str = "dp-allreduce", steps: int = 5,
             hang_s: float = HANG_S, **extra):
    body = {"preset": preset, "name": f"fault {fault['kind']}", "train": {"steps": steps},
            "runtime": {"hang_timeout_s": hang_s, "timeout_s": 300}, "faults": [fault],
            **extra}
    run = svc.submit(body)
    done = svc.wait_status(run["id"], ("succeeded", "failed", "hung", "timed_out",
                                       "cancelled"), 240)
    # the summary (with the diagnosis) follows the first report of a stopped run
    for _ in range(120):
        if done["summary"] is not None:
            break
        time.sleep(0.5)
        done = svc.run(run["id"])
    deadline = time.monotonic() + 10
    while (left := pids_with_run_id(run["id"])) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == [], f"processes of run {run['id']} still alive: {left}"
    return done


def diagnosis(run: dict) -> dict:
    d = (run.get("summary") or {}).get("diagnosis")
    assert d, f"no diagnosis stored: {run['status']} {run['error']}"
    return d


BASE = {"model": {"arch": "mlp", "hidden": 8, "layers": 2},
        "train": {"global_batch": 8, "optimizer": "sgd"}}
STEP = 2
SEQ = 4 * STEP  # dp-allreduce of a 2-layer MLP: four all-reduces per step


def faulty(svc, fault: dict, *, steps: int = 5, hang_s: float = HANG_S) -> dict:
    return run_with(svc, fault, steps=steps, hang_s=hang_s, model=BASE["model"],
                    train={**BASE["train"], "steps": steps})


def files_of(svc, run_id: str) -> set[str]:
    return {f["path"] for f in svc.http.get(f"/api/runs/{run_id}/files").json()}


def test_a_hang_is_stopped_as_hung_with_stacks_and_the_waited_for_rank(svc):
    run = faulty(svc, {"kind": "hang", "ranks": [1], "step": STEP, "op": "all_reduce"})
    assert run["status"] == "hung", run["error"]  # before runtime.timeout_s (300 s)
    d = diagnosis(run)
    assert d["waited_for"] == 1
    assert d["sentence"].startswith(f"rank 1 never entered all_reduce #{SEQ} of group dp "
                                    "[0, 1]")
    assert run["error"].startswith(d["sentence"])  # the run's error leads with it too
    files = files_of(svc, run["id"])
    assert {"diagnosis.json", "stack-rank0.txt", "stack-rank1.txt"} <= files
    full = svc.http.get(f"/api/runs/{run['id']}/files/diagnosis.json").json()
    assert "Thread" in full["stacks"]["0"]
    log = svc.http.get(f"/api/runs/{run['id']}/logs").text
    assert "runtime.hang_timeout_s" in log and "dumping every rank's stack" in log


@pytest.mark.parametrize("mode", ["exception", "exit"])
def test_a_crash_fails_the_run_naming_the_rank(svc, mode):
    run = faulty(svc, {"kind": "crash", "ranks": [1], "step": STEP, "mode": mode,
                       "exit_code": 7}, hang_s=SAFETY_S)
    assert run["status"] == "failed"
    d = diagnosis(run)
    assert d["waited_for"] == 1 and d["left"][0]["rank"] == 1
    want = "rank 1 raised InjectedCrash" if mode == "exception" else "rank 1 exited with code 7"
    assert d["sentence"].startswith(want), d["sentence"]
    assert f"in step {STEP}" in d["sentence"]


def test_a_skipped_collective_is_named_at_its_position(svc):
    run = faulty(svc, {"kind": "skip_collective", "ranks": [1], "step": STEP,
                       "op": "all_reduce"})
    assert run["status"] in ("hung", "failed")
    d = diagnosis(run)
    m = next(g for g in d["groups"] if g["key"] == "dp")["first_mismatch"]
    assert m["seq"] == SEQ and m["odd_ranks"] == [1]
    assert d["sentence"].startswith(f"rank 1 skipped all_reduce #{SEQ} of group dp [0, 1]")


def test_a_size_mismatch_is_named(svc):
    run = faulty(svc, {"kind": "mismatch", "ranks": [1], "step": STEP, "op": "all_reduce",
                       "mode": "size"})
    assert run["status"] in ("hung", "failed")
    d = diagnosis(run)
    assert d["waited_for"] == 1
    assert d["sentence"].startswith(f"dp [0, 1] disagrees at #{SEQ}: rank 1 issued all_reduce")


def test_data_running_out_on_one_rank_hangs_the_others(svc):
    run = faulty(svc, {"kind": "data_exhausted", "ranks": [1], "step": STEP})
    assert run["status"] == "hung"
    d = diagnosis(run)
    assert d["waited_for"] == 1
    assert f"rank 1 completed {STEP} steps and left its loop" in d["sentence"]


def test_nonfinite_gradients_name_their_source_rank(svc):
    run = faulty(svc, {"kind": "nonfinite", "ranks": [1], "step": STEP}, hang_s=SAFETY_S)
    assert run["status"] == "failed"
    d = diagnosis(run)
    assert d["sentence"].startswith(f"rank 1: non-finite local loss (nan) at step {STEP}")


def test_a_slow_rank_is_named_the_straggler_of_a_run_that_succeeds(svc):
    run = faulty(svc, {"kind": "slow", "ranks": [1], "step": 1, "steps": 3, "delay_s": 0.3},
                 steps=4, hang_s=SAFETY_S)
    assert run["status"] == "succeeded", run["error"]
    assert "diagnosis" not in run["summary"]
    h = run["summary"]["headline"]
    assert h["straggler_rank"] == 1 and h["straggler_cost_s"] > 0
    assert run["faults"] == ["slow (comm) on rank 1 at step 1, before collective, 0.3 s "
                             "for 3 steps"]
