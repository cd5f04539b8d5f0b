"""Two hosts (worker processes with their own names, host labels and data directories) of two
ranks each: gang placement makes competing multi-host runs take turns; cancel and the loss of a
host (kill -9 of its worker) stop every node and leave no process of the run on either host."""

import signal

import pytest

from tests.conftest import FINISHED, pids_with_run_id, wait_for
from tests.hosts.conftest import both_nodes_training

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

LONG = {"preset": "ddp", "parallel": {"dp": 4}, "runtime": {"nnodes": 2, "nproc_per_node": 2},
        "train": {"steps": 100000}}
SHORT = {**LONG, "train": {"steps": 2}}


def no_process_left(run_id: str) -> bool:
    return pids_with_run_id(run_id) == []


def test_gang_runs_take_turns_and_cancel_stops_every_node(two_hosts):
    c = two_hosts
    first = c.submit({**LONG, "name": "holds both hosts"})
    wait_for(lambda: both_nodes_training(c, first["id"]), 300, "both nodes of the first run")
    cl = c.http.get("/api/cluster").json()
    held = {h["host"]: [x["run"] for x in h["held_by"]] for h in cl["hosts"]}
    assert held == {"hostA": [first["id"]], "hostB": [first["id"]]}, held
    # the placer runs inside the submission: the second run's fate is decided when it returns
    second = c.submit({**SHORT, "name": "waits its turn"})
    waiting = c.run(second["id"])
    assert waiting["status"] == "queued" and waiting["nodes"] == [], waiting
    assert "needs 2 hosts with 2 free ranks each" in waiting["placement_wait"], waiting
    assert "hostA: 0 of 2 ranks free" in waiting["placement_wait"]
    assert first["id"] in waiting["placement_wait"]
    queued = {q["id"]: q for q in c.http.get("/api/cluster").json()["queued"]}
    assert queued[second["id"]]["reason"] == waiting["placement_wait"]

    assert c.http.post(f"/api/runs/{first['id']}/cancel").status_code == 200
    done = c.wait_status(first["id"], FINISHED, 90)
    assert done["status"] == "cancelled", done["error"]
    assert [n["status"] for n in done["nodes"]] == ["cancelled", "cancelled"], done["nodes"]
    wait_for(lambda: no_process_left(first["id"]), 30, "no process of the cancelled run")

    after = c.wait_status(second["id"], FINISHED, 180)
    assert after["status"] == "succeeded", after["error"]
    for a, b in zip(done["nodes"], after["nodes"], strict=True):
        assert a["host"] == b["host"]
        assert b["started_at"] >= a["finished_at"], (a, b)  # never both on a host at once
    assert no_process_left(second["id"])


def test_kill_9_of_a_hosts_worker_fails_the_run_as_host_lost(two_hosts):
    c = two_hosts
    run = c.submit({**LONG, "name": "loses host B"})
    wait_for(lambda: both_nodes_training(c, run["id"]), 300, "both nodes training")
    c.workers["hostB"].send_signal(signal.SIGKILL)
    c.workers["hostB"].wait()
    # the backend's reaper: no heartbeat from node 1 for PARALAB_RUN_HEARTBEAT_TIMEOUT_S (8 s);
    # the one real-time run of it (60 s of margin): its rule is checked on heartbeat rows
    # moved back in time in test_placement_unit.py
    done = c.wait_status(run["id"], FINISHED, 60)
    assert done["status"] == "failed"
    assert done["error"].startswith("host lost: hostB (node 1"), done["error"]
    nodes = {n["node"]: n for n in c.run(run["id"])["nodes"]}
    assert nodes[1]["status"] == "lost"
    wait_for(lambda: no_process_left(run["id"]), 30, "no process of the run on either host")
    # node 0 stopped too, and its worker still reported what its ranks traced
    wait_for(lambda: c.run(run["id"])["nodes"][0]["status"] != "running", 60, "node 0 to end")
    wait_for(lambda: c.run(run["id"])["summary"] is not None, 60, "node 0's summary")
    assert c.run(run["id"])["summary"]["nodes"][1]["status"] == "lost"
    c.start_host("hostB")  # the module's fixture stays two hosts
