"""Gang placement on both databases, without processes: all-or-nothing reservations, oldest
first without backfill, the words of the wait reason, claims that launch a node once, the
reaper's "host lost", and placers racing each other (threads, one session each) under
repeated submission: never a half-placed run, never a host's ranks over-committed."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from sqlalchemy import update

from backend import crud
from backend.core.db import get_sessionmaker
from backend.models import Run, RunNode, utcnow
from backend.services import placement
from jobs.spec import parse_spec
from paralab_core.queue import node_queue
from worker.nodes import run_outcome


def gang(nnodes=2, per=2, queue="qx", steps=2) -> dict:
    return {"preset": "ddp", "parallel": {"dp": nnodes * per},
            "train": {"steps": steps, "global_batch": 8 * nnodes * per},
            "runtime": {"nnodes": nnodes, "nproc_per_node": per, "queue": queue}}


@pytest.fixture
def db(settings):
    with get_sessionmaker(settings.db_url)() as session:
        yield session


def hosts(db, names=("hostA", "hostB"), *, ranks=2, slots=2, queue="qx"):
    for h in names:
        crud.upsert_worker(db, name=f"{queue}@{h}", host=h, queue=queue, slots=slots, busy=0,
                           devices=[{"type": "cpu", "name": "x"}], info={"ranks": ranks})


def submit(db, body) -> Run:
    return crud.create_run(db, parse_spec(body, max_world_size=64), owner="u", tags=[],
                           notes="")


def sent_to(box):
    return lambda settings, run_id, node, worker: box.append((run_id, node, worker))


def test_all_or_nothing_oldest_first_and_the_reason(db, settings):
    hosts(db)
    sent = []
    a, b = submit(db, gang()), submit(db, gang())
    assert placement.place_waiting(db, settings, sent_to(sent)) == [a.id]
    assert sorted(sent) == [(a.id, 0, "qx@hostA"), (a.id, 1, "qx@hostB")]
    assert [(n.host, n.status, n.ranks) for n in crud.nodes_of(db, a.id)] == [
        ("hostA", "reserved", 2), ("hostB", "reserved", 2)]
    assert crud.nodes_of(db, b.id) == []  # nothing half-held for the second
    why = placement.why_waiting(db, settings, b)
    assert why.startswith("needs 2 hosts with 2 free ranks each at once; 0 hosts of queue "
                          "'qx' has them now (hostA: 0 of 2 ranks free, held by "), why
    assert a.id in why
    # a younger one-node-per-host run that would fit elsewhere still waits behind b (no
    # backfill: a big run is never starved)
    hosts(db, ("hostC",), ranks=1)
    c = submit(db, gang(per=1))
    assert placement.place_waiting(db, settings, sent_to(sent)) == []
    assert "behind 1 earlier multi-host run" in placement.why_waiting(db, settings, c)


def test_reasons_for_missing_hosts_and_ranks(db, settings):
    run = submit(db, gang(nnodes=3))
    assert "no live worker serves queue 'qx'" in placement.why_waiting(db, settings, run)
    hosts(db)
    assert placement.why_waiting(db, settings, run) == (
        "needs 3 hosts at once; queue 'qx' has 2 live hosts (hostA, hostB)")
    big = submit(db, gang(per=4))
    assert "needs 4 ranks on each host (nproc_per_node); the largest worker of queue 'qx' " \
           "hosts 2" in placement.why_waiting(db, settings, big)


def test_claim_launches_a_node_once_and_only_on_its_worker(db, settings):
    hosts(db)
    run = submit(db, gang())
    placement.place_waiting(db, settings, sent_to([]))
    assert crud.claim_node(db, run.id, 1, worker="qx@hostA", task_id="t") == (
        False, "node 1 is placed on qx@hostB, not qx@hostA")
    assert crud.claim_node(db, run.id, 1, worker="qx@hostB", task_id="t") == (True, "claimed")
    assert crud.claim_node(db, run.id, 1, worker="qx@hostB", task_id="t") == (
        False, "node 1 is running, not reserved")  # a redelivered message
    db.refresh(run)
    assert run.status == "running"


def test_a_silent_node_fails_the_run_as_host_lost(db, settings):
    hosts(db)
    run = submit(db, gang())
    placement.place_waiting(db, settings, sent_to([]))
    for node, w in ((0, "qx@hostA"), (1, "qx@hostB")):
        assert crud.claim_node(db, run.id, node, worker=w, task_id="t")[0]
    db.execute(update(RunNode).where(RunNode.run_id == run.id, RunNode.node == 1)
               .values(heartbeat_at=utcnow() - timedelta(seconds=100)))
    db.commit()
    assert crud.reap_lost_nodes(db, timeout_s=30) == [(run.id, 1, "hostB")]
    db.refresh(run)
    assert run.status == "failed" and run.cancel_requested
    assert run.error.startswith("host lost: hostB (node 1, worker qx@hostB): no heartbeat for "
                                "more than 30 s")
    # node 0's late report of the run keeps the verdict and adds what it analysed
    crud.finish(db, run.id, status="failed", exit_code=1, error="gloo: connection reset",
                summary={"nodes": []}, provenance=None)
    db.refresh(run)
    assert run.error.startswith("host lost: hostB") and run.summary == {"nodes": []}


def test_cancel_of_a_placed_run_frees_its_hosts(db, settings):
    hosts(db)
    a, b = submit(db, gang()), submit(db, gang())
    placement.place_waiting(db, settings, sent_to([]))
    crud.request_cancel(db, a)
    assert [n.status for n in crud.nodes_of(db, a.id)] == ["cancelled", "cancelled"]
    assert crud.claim_node(db, a.id, 0, worker="qx@hostA", task_id="t")[0] is False
    assert placement.place_waiting(db, settings, sent_to([])) == [b.id]


@pytest.mark.parametrize("rounds", [8])
def test_racing_placers_never_half_place_or_overcommit(db, settings, rounds):
    """Repeated submission: each round two 2-host runs and two placers (their own sessions,
    threads) at once; then the placed run finishes and the other must be placed next."""
    hosts(db)
    maker = get_sessionmaker(settings.db_url)
    for _ in range(rounds):
        runs = [submit(db, gang()), submit(db, gang())]
        errors: list = []

        def placer(errors=errors):
            try:
                with maker() as s:
                    placement.place_waiting(s, settings, sent_to([]))
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
        threads = [threading.Thread(target=placer) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert errors == []
        held = [[n for n in crud.nodes_of(db, r.id) if n.status == "reserved"] for r in runs]
        assert sorted(len(h) for h in held) == [0, 2], held  # one whole, one not at all
        for host in ("hostA", "hostB"):
            used = sum(n.ranks for n in crud.active_nodes(db) if n.host == host)
            assert used <= 2, (host, used)
        for r in runs:  # the placed one runs and ends; the other is placed next
            for n in crud.nodes_of(db, r.id):
                crud.claim_node(db, r.id, n.node, worker=n.worker, task_id="t")
                crud.finish_node(db, r.id, n.node, status="succeeded", exit_code=0, error=None)
            placement.place_waiting(db, settings, sent_to([]))
        assert all(len(crud.nodes_of(db, r.id)) == 2 for r in runs)


def test_run_outcome_and_node_queue():
    def n(node, status, at=None):
        return {"node": node, "status": status, "finished_at": at}
    assert run_outcome("succeeded", [n(0, "succeeded"), n(1, "succeeded")], False) == (
        "succeeded", None)
    # the first of the failed nodes to end is the cause
    assert run_outcome("failed", [n(0, "failed", "2026-01-01T00:00:02"),
                                  n(1, "failed", "2026-01-01T00:00:01")], True) == ("failed", 1)
    assert run_outcome("failed", [n(0, "failed"), n(1, "lost")], True) == ("failed", 1)
    assert run_outcome("cancelled", [n(0, "cancelled"), n(1, "cancelled")], True)[0] == \
        "cancelled"
    assert run_outcome("cancelled", [n(0, "cancelled"), n(1, "hung")], True) == ("hung", 1)
    assert node_queue("q1@host A/x") == "node.q1_host_A_x"


def test_node_logs_get_contiguous_run_seqs_and_a_host_tag(db, settings):
    """Two nodes' batches interleaved, one retried: the run's log is one contiguous sequence,
    each line tagged with its host and node, its rank read behind the tag."""
    hosts(db)
    run = submit(db, gang())
    placement.place_waiting(db, settings, sent_to([]))

    def lines(a, b):
        return [{"seq": i, "ts": None, "line": f"[default{r}]:line {i}"}
                for i, r in zip(range(a, b), [0, 1] * b, strict=False)]
    new: list = []
    assert crud.append_node_logs(db, run.id, 0, lines(0, 3), out=new) == 3
    assert crud.append_node_logs(db, run.id, 1, lines(0, 2), out=new) == 2
    assert crud.append_node_logs(db, run.id, 0, lines(0, 3), out=new) == 0  # a retry
    assert crud.append_node_logs(db, run.id, 0, lines(2, 5), out=new) == 2  # overlapping
    got = crud.logs_after(db, run.id)
    assert [x.seq for x in got] == list(range(7))
    assert [(x.node, x.nseq) for x in got] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1),
                                                (0, 3), (0, 4)]
    assert got[3].line == "[hostB node1] [default0]:line 0" and got[3].rank == 0
    assert got[1].line.startswith("[hostA node0] [default1]:") and got[1].rank == 1
    assert [s for s, _, _ in new] == list(range(7))
