"""GET /api/cluster on SQLite and PostgreSQL, without processes: hosts grouped from the
workers' heartbeats, devices, slots, the runs on each host, and why each queued run waits
(backend/services/cluster.py's wait_reason, also tested alone)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import update

from backend import crud
from backend.core.db import get_sessionmaker
from backend.models import Run, Worker, utcnow
from backend.services.cluster import QueueStats, wait_reason
from jobs.spec import parse_spec

GPU = {"type": "cuda", "index": 0, "name": "H100", "memory_bytes": 80 << 30, "driver": "x"}
CPU = {"type": "cpu", "index": 0, "name": "Xeon", "cores": 16, "memory_bytes": 64 << 30}


def reason(q: QueueStats, **kw) -> str:
    args = {"nnodes": 1, "ranks_per_host": 2, "ahead": 0, "waited_s": 1.0, "attempts": 1,
            "claim_timeout_s": 120.0, "claim_attempts": 3, **kw}
    return wait_reason(q, **args)


# -- wait_reason alone ---------------------------------------------------------------------

def test_no_live_worker():
    assert reason(QueueStats("gpu9")).startswith("no live worker serves queue 'gpu9'")


def test_more_hosts_than_the_queue_has():
    q = QueueStats("g", workers=1, hosts={"a"}, slots=1)
    assert reason(q, nnodes=2) == "needs 2 hosts at once; queue 'g' has 1 live host"


def test_more_ranks_per_host_than_gpus():
    q = QueueStats("g", workers=2, hosts={"a", "b"}, slots=2, max_gpus_per_host=4)
    assert reason(q, ranks_per_host=8) == ("needs 8 GPUs on one host (nproc_per_node); the "
                                           "largest live host of queue 'g' has 4")
    assert "free" in reason(q, ranks_per_host=4)  # fits: not that reason
    cpu = QueueStats("c", workers=1, hosts={"a"}, slots=1)  # CPU ranks: no device limit
    assert "free" in reason(cpu, ranks_per_host=64)


def test_all_slots_busy():
    q = QueueStats("g", workers=2, hosts={"b", "a"}, slots=3, busy=3)
    assert reason(q) == ("every slot of queue 'g' is busy (3 of 3, on a, b): it starts when "
                         "one frees")


def test_behind_earlier_runs():
    q = QueueStats("g", workers=1, hosts={"a"}, slots=2, busy=1)
    assert reason(q, ahead=1) == "behind 1 earlier run of queue 'g' for its 1 free slot"
    assert reason(q, ahead=0) == "a slot of queue 'g' is free: the worker is about to claim it"


def test_free_slot_unclaimed_past_the_bound():
    q = QueueStats("g", workers=1, hosts={"a"}, slots=1)
    said = reason(q, waited_s=300, attempts=2)
    assert "no worker claimed the run in 300 s (published 2 of 3 times" in said


# -- the API on both databases ---------------------------------------------------------------


@pytest.fixture
def db(settings):
    with get_sessionmaker(settings.db_url)() as session:
        yield session


def _submit(db, queue: str, nproc: int = 2, name: str = "r", nnodes: int = 1) -> Run:
    spec = parse_spec({"preset": "ddp", "name": name, "parallel": {"dp": nproc * nnodes},
                       "runtime": {"queue": queue, "nproc_per_node": nproc, "nnodes": nnodes}},
                      max_world_size=8)
    return crud.create_run(db, spec, owner="local", tags=[], notes="")


def test_empty_cluster(client):
    body = client.get("/api/cluster").json()
    assert body["hosts"] == [] and body["queued"] == [] and body["queues"] == []
    assert body["queued_total"] == 0 and body["running_unseen"] == []


def test_hosts_devices_slots_runs_and_reasons(client, db):
    # host-a: two workers (queues gpu-a and cpu) sharing its CPU; host-b: one GPU worker
    crud.upsert_worker(db, name="wa", host="host-a", queue="gpu-a", slots=2, busy=1,
                       devices=[GPU, {**GPU, "index": 1}, CPU], info={})
    crud.upsert_worker(db, name="wa-cpu", host="host-a", queue="cpu", slots=1, busy=0,
                       devices=[CPU], info={})
    crud.upsert_worker(db, name="wb", host="host-b", queue="gpu-b", slots=1, busy=1,
                       devices=[GPU], info={})
    crud.upsert_worker(db, name="gone", host="host-c", queue="gpu-a", slots=4, busy=0,
                       devices=[GPU], info={})
    db.execute(update(Worker).where(Worker.name == "gone")
               .values(last_seen=utcnow() - timedelta(hours=1)))
    db.commit()
    on_a = _submit(db, "gpu-a", name="on a")
    assert crud.claim(db, on_a.id, worker="wa", task_id="t1")[0]
    on_b = _submit(db, "gpu-b", name="on b")
    assert crud.claim(db, on_b.id, worker="wb", task_id="t2")[0]
    lost = _submit(db, "gpu-a", name="lost")
    assert crud.claim(db, lost.id, worker="gone", task_id="t3")[0]
    nobody = _submit(db, "nobody", name="<b>nobody</b>")
    waits_b = _submit(db, "gpu-b", nproc=1, name="waits b")
    too_big = _submit(db, "gpu-a", nproc=4, name="too big")
    gang = _submit(db, "gpu-a", name="gang", nnodes=2)

    body = client.get("/api/cluster").json()
    hosts = {h["host"]: h for h in body["hosts"]}
    assert sorted(hosts) == ["host-a", "host-b"]  # host-c's worker is not live
    a, b = hosts["host-a"], hosts["host-b"]
    assert (a["slots"], a["busy"], a["free"]) == (3, 1, 2)
    assert a["queues"] == ["cpu", "gpu-a"]
    assert [w["name"] for w in a["workers"]] == ["wa", "wa-cpu"]
    kinds = [(d["type"], d["index"], d["worker"]) for d in a["devices"]]
    assert kinds == [("cuda", 0, "wa"), ("cuda", 1, "wa"), ("cpu", 0, "wa")]  # one CPU
    assert a["devices"][0]["memory_bytes"] == 80 << 30 and a["devices"][0]["name"] == "H100"
    assert [r["id"] for r in a["runs"]] == [on_a.id] and a["runs"][0]["worker"] == "wa"
    assert [r["id"] for r in b["runs"]] == [on_b.id]
    assert a["held_by"] == [] and b["held_by"] == []
    assert [r["id"] for r in body["running_unseen"]] == [lost.id]

    queued = {r["id"]: r for r in body["queued"]}
    assert list(queued) == [nobody.id, waits_b.id, too_big.id, gang.id]  # oldest first
    assert body["queued_total"] == 4
    assert queued[nobody.id]["name"] == "<b>nobody</b>"
    assert queued[nobody.id]["reason"].startswith("no live worker serves queue 'nobody'")
    assert queued[waits_b.id]["reason"].startswith("every slot of queue 'gpu-b' is busy (1 of 1")
    assert queued[too_big.id]["reason"] == ("needs 4 GPUs on one host (nproc_per_node); the "
                                            "largest live host of queue 'gpu-a' has 2")
    assert queued[gang.id]["nnodes"] == 2
    assert queued[gang.id]["reason"] == ("needs 2 hosts at once; queue 'gpu-a' has 1 live host "
                                         "(host-a)")  # the placer's words (placement.py)
    assert all(r["placement"] == [] for r in queued.values())
    assert queued[nobody.id]["world_size"] == 2 and queued[nobody.id]["waited_s"] >= 0

    queues = {q["queue"]: q for q in body["queues"]}
    assert queues["nobody"] == {"queue": "nobody", "hosts": [], "workers": 0, "slots": 0,
                                "busy": 0, "free": 0, "queued": 1}
    assert queues["gpu-a"]["hosts"] == ["host-a"] and queues["gpu-a"]["queued"] == 2
    assert queues["cpu"]["queued"] == 0 and queues["cpu"]["free"] == 1

    # a cancelled queued run no longer waits
    crud.request_cancel(db, nobody)
    again = client.get("/api/cluster").json()
    assert nobody.id not in {r["id"] for r in again["queued"]}
