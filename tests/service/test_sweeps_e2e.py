"""Sweeps end to end through a real worker (embedded service: SQLite, filesystem broker, real
torchrun on gloo): a 12-member grid (DDP / ZeRO-2 / ZeRO-3 x 2 bucket sizes x world sizes 2 and
4) runs through, with a backend restart in the middle that loses no member; then a sweep of
long `timed` runs is cancelled as a whole, its running and its queued members alike."""

from __future__ import annotations

import pytest

from tests.conftest import FINISHED, embedded_service, pids_with_run_id, wait_for

pytestmark = pytest.mark.slow

WORLD = [{"parallel": {"dp": n}, "runtime": {"nproc_per_node": n}} for n in (2, 4)]


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    yield from embedded_service(tmp_path_factory.mktemp("sweeps"))


def sweep(svc, sweep_id: str) -> dict:
    return svc.http.get(f"/api/sweeps/{sweep_id}").json()


def wait_sweep(svc, sweep_id: str, cond, timeout: float, what: str) -> dict:
    try:
        return wait_for(lambda: cond(s := sweep(svc, sweep_id)) and s, timeout, what)
    except AssertionError:
        raise AssertionError(f"{what}: {sweep(svc, sweep_id)}\n{svc.logs()}") from None


# 12 torchrun jobs one after another on a loaded 2-core CI machine took 288-295 s against the
# suite's 300 s default (issue 18's acceptance is the 12-member grid itself, so it is not cut)
@pytest.mark.timeout(900)
def test_a_12_member_grid_runs_through_a_backend_restart(svc):
    r = svc.http.post("/api/sweeps", json={
        "name": "strategy x bucket x world", "queue": svc.queue,
        "base": {"preset": "ddp", "model": {"arch": "mlp"}, "train": {"steps": 2}},
        "grid": {"parallel.zero_stage": [0, 2, 3], "parallel.bucket_mb": [1, 25], ".": WORLD}})
    assert r.status_code == 201, r.text
    s = r.json()
    assert s["counts"]["total"] == 12 and all(m["run_id"] for m in s["members"])
    runs = [m["run_id"] for m in s["members"]]
    # restart the backend once a member has finished and others still wait
    wait_sweep(svc, s["id"], lambda x: x["counts"].get("succeeded", 0) >= 1, 240,
               "a first member to succeed")
    svc.stop(svc.backend)
    svc.start_backend()
    after = sweep(svc, s["id"])
    assert [m["run_id"] for m in after["members"]] == runs
    assert after["status"] in ("running", "succeeded")
    done = wait_sweep(svc, s["id"], lambda x: x["status"] not in ("queued", "running"), 900,
                      "the sweep to finish")
    assert done["status"] == "succeeded", done["counts"]
    assert done["counts"] == {"succeeded": 12, "total": 12}
    got = {(m["run"]["strategy"], m["overrides"]["parallel"]["bucket_mb"], m["run"]["world_size"])
           for m in done["members"]}
    assert got == {(st, b, w) for st in ("ddp", "zero2", "zero3") for b in (1, 25)
                   for w in (2, 4)}
    for m in done["members"]:  # every member's key figures, from its analysis headline
        meas = m["run"]["measured"]
        assert meas["step_time_s"] > 0 and meas["peak_memory_bytes"] > 0, m
        assert meas["exposed_comm_s"] is not None and m["predicted"]["peak_memory_bytes"] > 0
    # the page serves it (tests/frontend/test_sweep_page.py renders one)
    assert svc.http.get(f"/sweeps/{s['id']}").status_code == 200


def test_cancelling_a_sweep_stops_its_running_and_queued_members(svc):
    slow = {"model": {"arch": "timed", "layers": 2, "hidden": 16, "t_forward": 0.5},
            "train": {"steps": 10_000}}
    r = svc.http.post("/api/sweeps", json={
        "name": "long", "queue": svc.queue, "base": {"preset": "ddp", **slow},
        "members": [{}, {"parallel": {"bucket_mb": 1}}, {"parallel": {"zero_stage": 3}}]})
    assert r.status_code == 201, r.text
    s = r.json()
    running = wait_sweep(svc, s["id"], lambda x: x["counts"].get("running", 0) == 1, 120,
                         "a member to start")
    assert running["status"] == "running" and running["counts"]["queued"] == 2
    run_id = next(m["run_id"] for m in running["members"] if m["status"] == "running")
    wait_for(lambda: len(pids_with_run_id(run_id)) >= 2, 60, "its ranks")
    c = svc.http.post(f"/api/sweeps/{s['id']}/cancel")
    assert c.status_code == 200, c.text
    done = wait_sweep(svc, s["id"], lambda x: all(m["status"] in FINISHED
                                                  for m in x["members"]), 120,
                      "every member to finish")
    assert done["status"] == "cancelled" and done["counts"] == {"cancelled": 3, "total": 3}
    wait_for(lambda: not pids_with_run_id(run_id), 60, "the ranks to exit")
    assert svc.http.post(f"/api/sweeps/{s['id']}/cancel").status_code == 409
