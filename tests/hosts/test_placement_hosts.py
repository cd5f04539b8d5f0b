"""Placement by host, and the republication count of unclaimed nodes (issue 43, misses 2 and
3), on both databases, without processes: workers are heartbeat rows, time is the rows'
timestamps moved back.

- Two workers on one host are one host: a 2-node run never gets both of its nodes there
  (the point of several hosts is several machines); with a second host it gets one node on
  each. Expected by hand from the worker table.
- An unclaimed node is published `queue_claim_attempts` times in all (once when placed, then
  once per reconciler pass past the claim bound), and the pass after the last fails the run
  naming that count."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import update

from backend import crud
from backend.core.db import get_sessionmaker
from backend.models import RunNode, utcnow
from backend.services import placement
from tests.hosts.test_placement_unit import gang, hosts, sent_to, submit


@pytest.fixture
def db(settings):
    with get_sessionmaker(settings.db_url)() as session:
        yield session


def worker(db, name, host, *, ranks=2, queue="qx"):
    crud.upsert_worker(db, name=name, host=host, queue=queue, slots=2, busy=0,
                       devices=[{"type": "cpu", "name": "x"}], info={"ranks": ranks})


def test_pick_counts_hosts_not_workers():
    caps = [placement.Capacity("w1", "hostA", 2, 2), placement.Capacity("w2", "hostA", 2, 2)]
    assert placement.pick(caps, 2, 2) is None  # one host, however many workers
    caps.append(placement.Capacity("w3", "hostB", 2, 2))
    got = placement.pick(caps, 2, 2)
    assert got is not None and sorted((c.host, c.worker) for c in got) == [
        ("hostA", "w1"), ("hostB", "w3")]


def test_two_workers_on_one_host_never_hold_two_nodes(db, settings):
    worker(db, "qx@hostA-1", "hostA")
    worker(db, "qx@hostA-2", "hostA")
    sent: list = []
    run = submit(db, gang(nnodes=2, per=2))
    assert placement.place_waiting(db, settings, sent_to(sent)) == []
    assert sent == [] and crud.nodes_of(db, run.id) == []
    why = placement.why_waiting(db, settings, run)
    assert why == "needs 2 hosts at once; queue 'qx' has 1 live host (hostA)", why
    worker(db, "qx@hostB-1", "hostB")
    assert placement.place_waiting(db, settings, sent_to(sent)) == [run.id]
    nodes = crud.nodes_of(db, run.id)
    assert sorted(n.host for n in nodes) == ["hostA", "hostB"]
    assert sorted(w for _, _, w in sent) == ["qx@hostA-1", "qx@hostB-1"]  # first by name


def _age_nodes(db, run_id: str, s: float) -> None:
    db.execute(update(RunNode).where(RunNode.run_id == run_id)
               .values(reserved_at=utcnow() - timedelta(seconds=s)))
    db.commit()


@pytest.mark.parametrize("attempts", [1, 3])
def test_unclaimed_nodes_are_published_attempts_times_then_fail(db, settings, attempts):
    settings = settings.model_copy(update={"queue_claim_timeout_s": 60.0,
                                           "queue_claim_attempts": attempts})
    hosts(db)
    sent: list = []
    run = submit(db, gang())
    assert placement.place_waiting(db, settings, sent_to(sent)) == [run.id]
    assert len(sent) == 2  # one publication per node
    # not yet past the claim bound: nothing happens
    assert placement.reconcile_nodes(db, settings, sent_to(sent))["republished"] == []
    for k in range(2, attempts + 1):  # publications 2 .. attempts: one per pass and node
        _age_nodes(db, run.id, 61)
        out = placement.reconcile_nodes(db, settings, sent_to(sent))
        assert out["republished"] == [run.id, run.id] and out["failed"] == [], (k, out)
        assert len(sent) == 2 * k
        assert sorted(n.publish_attempts for n in crud.nodes_of(db, run.id)) == [k, k]
    _age_nodes(db, run.id, 61)
    out = placement.reconcile_nodes(db, settings, sent_to(sent))
    assert out["republished"] == [] and out["failed"] == [run.id], out
    assert len(sent) == 2 * attempts  # queue_claim_attempts publications per node, no more
    assert sorted((node, w) for _, node, w in sent) == sorted(
        [(0, "qx@hostA"), (1, "qx@hostB")] * attempts)
    got = crud.get_run(db, run.id)
    db.refresh(got)
    assert got.status == "failed"
    assert f"was not claimed after {attempts} publications" in got.error, got.error
