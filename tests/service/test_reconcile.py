"""No run stays "queued" forever (issue 14, item 3), on real Redis + a real Celery worker:
a message lost from the broker is published again by the backend's reconciler and the run
starts; a worker with a wrong PARALAB_WORKER_TOKEN is named by /api/health (its heartbeat
thread keeps trying through the 401s) and the run starts once a worker with the right token
runs; with no worker at all the run fails with the reason, within the bound."""

from __future__ import annotations

import secrets
import socket
import subprocess

import pytest
import redis
from sqlalchemy import create_engine, text

from tests.conftest import REDIS_URL, Service, _fresh_pg_database, wait_for

pytestmark = pytest.mark.slow

SHORT = {"preset": "ddp", "train": {"steps": 2},
         "model": {"arch": "timed", "layers": 2, "hidden": 16, "t_forward": 0.001,
                   "t_backward_input": 0.001, "t_backward_weight": 0.001}}


@pytest.fixture
def pg_url(pg_server_url):
    url, drop = _fresh_pg_database(pg_server_url)
    yield url
    drop()


def _service(tmp_path, db_url, *, timeout_s: float, attempts: int) -> Service:
    return Service(tmp_path, db_url=db_url, redis_url=REDIS_URL, extra_env={
        "PARALAB_QUEUE_CLAIM_TIMEOUT_S": str(timeout_s),
        "PARALAB_QUEUE_CLAIM_ATTEMPTS": str(attempts)})


def _attempts(db_url: str, run_id: str) -> int:
    engine = create_engine(db_url)
    try:
        with engine.connect() as c:
            return c.execute(text("SELECT enqueue_attempts FROM runs WHERE id = :i"),
                             {"i": run_id}).scalar_one()
    finally:
        engine.dispose()


def _launches(svc: Service, run_id: str) -> int:
    return svc.http.get(f"/api/runs/{run_id}/logs").text.count("[paralab] launching")


def test_a_message_lost_by_the_broker_is_published_again(tmp_path, pg_url):
    svc = _service(tmp_path, pg_url, timeout_s=3, attempts=30)
    broker = redis.Redis.from_url(REDIS_URL)
    try:
        svc.start_backend()  # no worker yet: the message waits in the queue's Redis key
        run = svc.submit(SHORT)
        keys = [k for k in broker.scan_iter(match=f"{svc.queue}*") if broker.type(k) == b"list"]
        assert keys and sum(broker.llen(k) for k in keys) >= 1
        broker.delete(*keys)  # the loss (FLUSHALL would hit every test sharing this Redis)
        health = wait_for(lambda: (h := svc.http.get("/api/health").json())["checks"][
            "queue"]["unclaimed"] and h, 60, "health to report the unclaimed run")
        assert health["status"] == "degraded" and not health["ok"]
        assert [r["id"] for r in health["checks"]["queue"]["unclaimed"]] == [run["id"]]
        assert any("not claimed by any worker within 3 s" in p for p in health["problems"])
        svc.start_worker()
        done = svc.wait_status(run["id"], ("succeeded", "failed"), 120)
        assert done["status"] == "succeeded", done["error"]
        assert _attempts(pg_url, run["id"]) >= 2 and _launches(svc, run["id"]) == 1
        assert svc.http.get("/api/health").json()["checks"]["queue"]["unclaimed"] == []
    finally:
        svc.close()
        broker.close()


def test_a_worker_with_a_wrong_token_is_named_and_the_run_starts_once_it_is_fixed(tmp_path,
                                                                                  pg_url):
    svc = _service(tmp_path, pg_url, timeout_s=3, attempts=40)
    name = f"{svc.queue}@{socket.gethostname()}"
    wrong = None
    try:
        svc.start_backend()
        log = open(tmp_path / "wrong-worker.log", "ab")
        wrong = subprocess.Popen(
            svc._argv("worker"), cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT,
            env={**svc.env, "PARALAB_WORKER_TOKEN": secrets.token_urlsafe(24)},
            start_new_session=True)
        run = svc.submit(SHORT)
        # its claim is refused and the message consumed; the reconciler publishes it again
        wait_for(lambda: f"run {run['id']} not launched: the backend refuses this worker's "
                 "credential" in (tmp_path / "wrong-worker.log").read_text(errors="replace"),
                 90, "the wrong worker to be refused at claim")

        def refused(at_least: int):
            h = svc.http.get("/api/health").json()
            rows = [r for r in h["checks"]["worker_auth"]["rejected"] if r["name"] == name]
            return rows and rows[0]["count"] >= at_least and h
        first = wait_for(lambda: refused(1), 60, "health to name the refused worker")
        assert first["status"] == "degraded" and any(
            name in p and "PARALAB_WORKER_TOKEN" in p for p in first["problems"])
        # the heartbeat thread outlives the 401s: the count keeps growing
        wait_for(lambda: refused(first["checks"]["worker_auth"]["rejected"][0]["count"] + 3),
                 60, "more heartbeats from the refused worker")
        assert "PARALAB_WORKER_TOKEN does not match" in (
            tmp_path / "wrong-worker.log").read_text(errors="replace")
        assert svc.run(run["id"])["status"] == "queued"
        svc.stop(wrong)
        svc.start_worker()  # the right token
        done = svc.wait_status(run["id"], ("succeeded", "failed"), 120)
        assert done["status"] == "succeeded", done["error"]
        assert _launches(svc, run["id"]) == 1
        assert svc.http.get("/api/health").json()["checks"]["worker_auth"]["rejected"] == []
    finally:
        svc.stop(wrong)
        svc.close()


def test_with_no_worker_the_run_fails_with_its_reason_within_the_bound(tmp_path):
    svc = _service(tmp_path, f"sqlite:///{tmp_path / 'p.db'}", timeout_s=1, attempts=2)
    try:
        svc.start_backend()
        run = svc.submit(SHORT)
        done = svc.wait_status(run["id"], ("failed", "succeeded", "running"), 60)
        assert done["status"] == "failed" and done["started_at"] is None
        assert done["error"].startswith("no worker claimed the run after 2 attempts over ")
        assert f"queue {svc.queue!r}" in done["error"]
        assert "PARALAB_WORKER_TOKEN" in done["error"]
    finally:
        svc.close()
