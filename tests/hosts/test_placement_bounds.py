"""No run waits forever (issue 36, item 2), on both databases, without processes: workers are
heartbeat rows, time is the rows' timestamps moved back (no sleeping, no wall-clock asserts).

- a multi-host run that no combination of the queue's live hosts can hold is skipped by the
  placer (a younger run that fits is placed), and the reconciler fails it after
  `gang_unplaceable_timeout_s` with the reason naming the hosts; a host briefly away still
  counts;
- a run that could fit were the hosts free still blocks younger ones (no-starvation kept);
- submission refuses what the queue's known hosts can never hold (422 on the field), and
  accepts it on a queue without workers yet;
- /api/health turns degraded when a queued run has waited past `queue_wait_warn_s`.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

import tests.hosts.test_placement_unit as pu
from backend import crud
from backend.core.db import get_sessionmaker
from backend.main import create_app
from backend.models import Run, Worker, utcnow
from backend.services import placement
from jobs.spec import parse_spec

gang, hosts, submit, sent_to = pu.gang, pu.hosts, pu.submit, pu.sent_to


@pytest.fixture
def db(settings):
    with get_sessionmaker(settings.db_url)() as session:
        yield session


def _bounded(settings, **kw):
    return settings.model_copy(update={"gang_unplaceable_timeout_s": 60.0, **kw})


def _age(db, run_id: str, s: float) -> None:
    db.execute(update(Run).where(Run.id == run_id)
               .values(created_at=utcnow() - timedelta(seconds=s)))
    db.commit()


def _last_seen(db, worker: str, ago_s: float) -> None:
    db.execute(update(Worker).where(Worker.name == worker)
               .values(last_seen=utcnow() - timedelta(seconds=ago_s)))
    db.commit()


def test_a_run_no_hosts_can_hold_blocks_nothing_then_fails_with_the_hosts(db, settings):
    settings = _bounded(settings)
    hosts(db)  # hostA, hostB: 2 ranks each
    big = submit(db, gang(nnodes=3))  # stored before the check (or its hosts went away)
    young = submit(db, gang(nnodes=2))
    sent: list = []
    assert placement.place_waiting(db, settings, sent_to(sent)) == [young.id]
    assert sorted(w for _, _, w in sent) == ["qx@hostA", "qx@hostB"]
    assert placement.why_waiting(db, settings, big) == (
        "needs 3 hosts at once; queue 'qx' has 2 live hosts (hostA, hostB)")
    # within the bound it waits (a third host may be coming)
    assert placement.reconcile_nodes(db, settings, sent_to(sent))["unplaceable"] == []
    db.refresh(big)
    assert big.status == "queued"
    _age(db, big.id, 61)
    assert placement.reconcile_nodes(db, settings, sent_to(sent))["unplaceable"] == [big.id]
    db.refresh(big)
    assert big.status == "failed" and big.finished_at is not None
    assert big.error == (
        "not placed within 60 s (PARALAB_GANG_UNPLACEABLE_TIMEOUT_S): no combination of the "
        "hosts of queue 'qx' could hold it: needs 3 hosts at once; queue 'qx' has 2 live "
        "hosts (hostA, hostB)")
    assert crud.nodes_of(db, big.id) == []
    db.refresh(young)
    assert young.status == "queued" and len(crud.nodes_of(db, young.id)) == 2  # untouched


def test_too_few_large_hosts_is_unplaceable_too(db, settings):
    """Hosts enough, but only one whose worker hosts nproc_per_node ranks."""
    settings = _bounded(settings)
    hosts(db, ("hostA",), ranks=4)
    hosts(db, ("hostB", "hostC"), ranks=2)
    big = submit(db, gang(nnodes=2, per=4))
    young = submit(db, gang(nnodes=2, per=2))
    assert placement.place_waiting(db, settings, sent_to([])) == [young.id]
    _age(db, big.id, 61)
    assert placement.reconcile_nodes(db, settings, sent_to([]))["unplaceable"] == [big.id]
    db.refresh(big)
    assert big.error.endswith("needs 2 hosts with 4 ranks each (nproc_per_node); only 1 of "
                              "the 3 live hosts of queue 'qx' has a worker that large "
                              "(hostA)"), big.error


def test_a_host_briefly_away_still_counts_until_the_bound(db, settings):
    settings = _bounded(settings)
    hosts(db, ("hostA", "hostB", "hostC"))
    big = submit(db, gang(nnodes=3))
    _age(db, big.id, 1000)
    # hostC restarting: not live (worker_alive_s = 15 s), seen within the bound
    _last_seen(db, "qx@hostC", settings.worker_alive_s + 5)
    young = submit(db, gang(nnodes=2))
    assert placement.place_waiting(db, settings, sent_to([])) == [young.id]  # not blocked
    assert placement.reconcile_nodes(db, settings, sent_to([]))["unplaceable"] == []
    db.refresh(big)
    assert big.status == "queued"
    # gone for the whole bound: it could not have been placed at any moment of it
    _last_seen(db, "qx@hostC", 60 + settings.worker_alive_s + 1)
    assert placement.reconcile_nodes(db, settings, sent_to([]))["unplaceable"] == [big.id]
    db.refresh(big)
    assert big.status == "failed" and "(hostA, hostB)" in big.error


def test_a_run_that_can_fit_still_blocks_younger_ones(db, settings):
    """No-starvation kept: the 3-host run would fit were its hosts free, so the younger
    2-host run that fits the free hosts now waits behind it, and the bound never fails it."""
    settings = _bounded(settings)
    hosts(db, ("hostA", "hostB", "hostC", "hostD"))
    first = submit(db, gang(nnodes=2))
    assert placement.place_waiting(db, settings, sent_to([])) == [first.id]  # hostA, hostB
    big = submit(db, gang(nnodes=3))
    young = submit(db, gang(nnodes=2))
    _age(db, big.id, 1000)
    placement.reconcile_nodes(db, settings, sent_to([]))  # places what may be placed
    assert crud.nodes_of(db, young.id) == [] and crud.nodes_of(db, big.id) == []
    db.refresh(big)
    assert big.status == "queued"
    why = placement.why_waiting(db, settings, young)
    assert why.startswith("behind 1 earlier multi-host run of queue 'qx'") and big.id in why
    for n in crud.nodes_of(db, first.id):  # the first ends: the big one goes next
        crud.claim_node(db, first.id, n.node, worker=n.worker, task_id="t")
        crud.finish_node(db, first.id, n.node, status="succeeded", exit_code=0, error=None)
    assert placement.place_waiting(db, settings, sent_to([])) == [big.id]


def _body(nnodes=3, per=2, queue="qx") -> dict:
    return gang(nnodes=nnodes, per=per, queue=queue)


def test_submit_refuses_what_the_known_hosts_can_never_hold(db, client, settings):
    hosts(db)
    r = client.post("/api/runs", json=_body())
    assert r.status_code == 422, r.text
    [err] = r.json()["detail"]
    assert err["loc"] == ["body", "runtime", "nnodes"]
    assert "needs 3 hosts at once; queue 'qx' has 2 known hosts (hostA, hostB)" in err["msg"]
    r = client.post("/api/runs", json=_body(nnodes=2, per=4))
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == [
        "body", "runtime", "nproc_per_node"]
    assert client.get("/api/runs").json()["items"] == []  # nothing stored
    # a queue without any worker yet: accepted (the bound ends it if none comes)
    assert client.post("/api/runs", json=_body(queue="later")).status_code == 201
    # a host restarting (not live, seen recently) still counts
    hosts(db, ("hostC",))
    _last_seen(db, "qx@hostC", settings.worker_alive_s + 5)
    assert client.post("/api/runs", json=_body()).status_code == 201


def test_a_sweep_member_the_known_hosts_can_never_hold_is_kept_invalid(db, client):
    # the same rule as a run's submit (services.runs.spec_errors): not launched to wait out
    # the bound
    hosts(db)
    three = {k: v for k, v in _body(nnodes=3).items() if k != "preset"}
    r = client.post("/api/sweeps", json={"base": _body(nnodes=2), "grid": {".": [{}, three]}})
    assert r.status_code == 201, r.text
    ok, bad = r.json()["members"]
    assert ok["run_id"] is not None and ok["errors"] is None
    assert bad["run_id"] is None and bad["status"] == "invalid"
    assert bad["errors"][0]["loc"] == ["body", "runtime", "nnodes"]
    assert "needs 3 hosts at once" in bad["errors"][0]["msg"]


def test_health_is_degraded_past_the_wait_bound(db, settings):
    settings = settings.model_copy(update={"queue_wait_warn_s": 100.0,
                                           "queue_claim_timeout_s": 1e6,
                                           "disk_min_free_bytes": 0})
    hosts(db, slots=1)
    one = crud.create_run(db, parse_spec({"preset": "ddp", "train": {"steps": 2},
                                          "runtime": {"queue": "qx"}}, max_world_size=8),
                          owner="local", tags=[], notes="")
    big = submit(db, gang(nnodes=3))
    with TestClient(create_app(settings)) as c:
        for run in (one, big):
            _age(db, run.id, 50)
        health = c.get("/api/health").json()
        assert health["status"] == "ok", health
        assert health["checks"]["queue_wait"] == {"ok": True, "warn_s": 100.0, "count": 0,
                                                  "waiting": []}
        for run in (one, big):
            _age(db, run.id, 500)
        hosts(db, slots=1)  # heartbeats go on
        health = c.get("/api/health").json()
    assert health["status"] == "degraded"
    check = health["checks"]["queue_wait"]
    assert not check["ok"] and check["count"] == 2
    got = {x["id"]: x for x in check["waiting"]}
    assert set(got) == {one.id, big.id}
    assert got[big.id]["reason"] == (
        "needs 3 hosts at once; queue 'qx' has 2 live hosts (hostA, hostB)")
    assert got[one.id]["reason"] == "a slot of queue 'qx' is free: the worker is about to " \
                                    "claim it"
    assert got[one.id]["nnodes"] == 1 and got[big.id]["nnodes"] == 3
    assert got[one.id]["queued_s"] >= 500
    [said] = [p for p in health["problems"] if "PARALAB_QUEUE_WAIT_WARN_S" in p]
    assert said.startswith("2 queued run(s) waited longer than 100 s")
    assert one.id in said and big.id in said and "(hostA, hostB)" in said
