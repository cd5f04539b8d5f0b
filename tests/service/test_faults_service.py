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

HANG_S = 4.0  # runtime.hang_timeout_s of the runs that hang


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    yield from embedded_service(tmp_path_factory.mktemp("faults"))


def run_with(svc, fault: dict, *, preset: str = "dp-allreduce", steps: int = 5, **extra):
    body = {"preset": preset, "name": f"fault {fault['kind']}", "train": {"steps": steps},
            "runtime": {"hang_timeout_s": HANG_S, "timeout_s": 300}, "faults": [fault],
            **extra}
    run = svc.submit(body)
    t0 = time.monotonic()
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
    done["_elapsed_s"] = time.monotonic() - t0
    return done


def diagnosis(run: dict) -> dict:
    d = (run.get("summary") or {}).get("diagnosis")
    assert d, f"no diagnosis stored: {run['status']} {run['error']}"
    return d
