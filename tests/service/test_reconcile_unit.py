"""The reconciler, health's checks and the disk-full mapping, on both databases, without
processes: the attempt lock, the waiting-for-a-slot rule, the failure's words, the free-space
check with an injected `shutil.disk_usage`, ENOSPC / SQLITE_FULL -> 507, and a late finish
replacing a reaped "worker lost"."""

from __future__ import annotations

import errno
import sqlite3
from collections import namedtuple
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update
from sqlalchemy.exc import OperationalError

from backend import crud, storage
from backend.core.db import get_sessionmaker
from backend.main import create_app
from backend.models import Run, utcnow
from backend.services.health import disk_check, worker_checks
from backend.services.reconcile import reconcile_once
from jobs.spec import parse_spec

SPEC = {"preset": "ddp", "train": {"steps": 2}, "runtime": {"queue": "qx"}}


@pytest.fixture
def db(settings):
    with get_sessionmaker(settings.db_url)() as session:
        yield session


def _queued(db, *, age_s: float = 1000) -> Run:
    run = crud.create_run(db, parse_spec(SPEC, max_world_size=8), owner="local", tags=[],
                          notes="")
    db.execute(update(Run).where(Run.id == run.id)
               .values(enqueued_at=utcnow() - timedelta(seconds=age_s)))
    db.commit()
    return run


def _age(db, run_id: str, s: float = 1000) -> None:
    db.execute(update(Run).where(Run.id == run_id)
               .values(enqueued_at=utcnow() - timedelta(seconds=s)))
    db.commit()


def test_one_backend_process_takes_each_attempt(db, settings):
    """Two processes that both saw the run stale at attempt 1: one publishes, one does not."""
    run = _queued(db)
    with get_sessionmaker(settings.db_url)() as other:
        assert [crud.mark_enqueued(db, run.id, attempts=1),
                crud.mark_enqueued(other, run.id, attempts=1)] == [True, False]
        assert not crud.fail_unclaimed(other, run.id, attempts=1, error="x")
    assert crud.fail_unclaimed(db, run.id, attempts=2, error="gone")
    assert crud.claim(db, run.id, worker="w", task_id="t") == (False, "run is failed, not queued")


def test_reconcile_publishes_again_then_fails_with_the_reason(db, settings):
    settings = settings.model_copy(update={"queue_claim_timeout_s": 10,
                                           "queue_claim_attempts": 2})
    sent = []
    run = _queued(db)
    fresh = _queued(db, age_s=0)
    done = reconcile_once(db, settings, enqueue=lambda s, rid, q: sent.append((rid, q)))
    assert done["requeued"] == [run.id] and sent == [(run.id, "qx")]
    assert reconcile_once(db, settings, enqueue=lambda *a: sent.append(a))["requeued"] == []
    _age(db, run.id)
    done = reconcile_once(db, settings, enqueue=lambda *a: sent.append(a))
    assert done["failed"] == [run.id] and len(sent) == 1
    db.expire_all()
    failed = crud.get_run(db, run.id)
    assert failed.status == "failed" and failed.enqueue_attempts == 2
    assert "no worker claimed the run after 2 attempts" in failed.error
    assert "queue 'qx'" in failed.error and "PARALAB_WORKER_TOKEN" in failed.error
    assert crud.get_run(db, fresh.id).status == "queued"


def test_a_run_waiting_for_a_busy_worker_is_not_counted(db, settings):
    settings = settings.model_copy(update={"queue_claim_timeout_s": 10})
    crud.upsert_worker(db, name="w1", host="h", queue="qx", slots=1, busy=1, devices=[],
                       info={})
    run = _queued(db)
    assert worker_checks(db, settings)[0]["queue"]["ok"]  # waiting its turn is not trouble
    done = reconcile_once(db, settings, enqueue=lambda *a: pytest.fail("published"))
    assert done["waiting"] == [run.id]
    db.expire_all()
    again = crud.get_run(db, run.id)
    assert again.status == "queued" and again.enqueue_attempts == 1
    assert crud.unclaimed_runs(db, older_than_s=10) == []  # its clock started again


def test_refused_worker_credentials_are_listed_until_the_worker_reports_in(db):
    crud.record_rejection(db, name="q@h", host="h", remote="10.0.0.2")
    crud.record_rejection(db, name="q@h", host="h", remote="10.0.0.2")
    [r] = crud.list_rejections(db, within_s=60)
    assert (r.name, r.count, r.remote) == ("q@h", 2, "10.0.0.2")
    crud.upsert_worker(db, name="q@h", host="h", queue="q", slots=1, busy=0, devices=[],
                       info={})
    assert crud.list_rejections(db, within_s=60) == []


def test_a_late_finish_replaces_a_reaped_worker_lost(db):
    run = _queued(db)
    assert crud.claim(db, run.id, worker="w", task_id="t")[0]
    db.execute(update(Run).where(Run.id == run.id)
               .values(heartbeat_at=utcnow() - timedelta(seconds=100)))
    db.commit()
    assert crud.reap_lost_runs(db, timeout_s=10) == [run.id]
    done = crud.finish(db, run.id, status="failed", exit_code=1, error="rank 1: OSError",
                       summary=None, provenance=None)
    assert (done.status, done.exit_code, done.error) == ("failed", 1, "rank 1: OSError")
    # a run that its worker already reported is never changed by a second, different report
    again = crud.finish(db, run.id, status="succeeded", exit_code=0, error=None, summary=None,
                        provenance=None)
    assert (again.status, again.exit_code) == ("failed", 1)


Usage = namedtuple("Usage", "total used free")


def test_disk_check_is_degraded_below_the_threshold(tmp_path):
    ok, said = disk_check(tmp_path, 10**9, usage=lambda p: Usage(10**12, 0, 5 * 10**9))
    assert ok["ok"] and said == [] and ok["free_bytes"] == 5 * 10**9
    low, said = disk_check(tmp_path / "var", 10**9, usage=lambda p: Usage(10**12, 0, 10**8))
    assert not low["ok"] and low["path"] == str(tmp_path.resolve())
    assert said == [f"only 100 MB free under the data directory {tmp_path.resolve()} "
                    "(PARALAB_DISK_MIN_FREE_BYTES is 1000 MB): runs, logs and uploads will "
                    "soon fail to be stored"]


@pytest.mark.parametrize("exc,full", [
    (OSError(errno.ENOSPC, "No space left on device"), True),
    (OSError(errno.EDQUOT, "Disk quota exceeded"), True),
    (OSError(errno.EACCES, "Permission denied"), False),
    (OperationalError("INSERT", {}, sqlite3.OperationalError("database or disk is full")),
     True),
    (OperationalError("INSERT", {}, sqlite3.OperationalError("database is locked")), False),
])
def test_what_counts_as_a_full_disk(exc, full):
    assert storage.is_disk_full(exc) is full


def test_disk_full_submit_is_a_507_with_words_and_health_degraded(settings, tmp_path,
                                                                   monkeypatch):
    flag = tmp_path / "full"
    monkeypatch.setenv(storage.TEST_DISK_FULL_ENV, str(flag))
    monkeypatch.setattr(storage, "last_failure", None)
    with TestClient(create_app(settings)) as c:
        rid = c.post("/api/runs", json=SPEC).json()["id"]
        flag.touch()
        up = c.put(f"/api/internal/runs/{rid}/files/trace.jsonl", content=b"{}\n",
                   headers={"Authorization": "Bearer " + "t" * 32})
        assert up.status_code == 507 and up.json()["detail"].startswith(
            f"could not write {settings.runs_dir / rid / 'trace.jsonl'}"), up.text
        r = c.post("/api/runs", json=SPEC)
        assert r.status_code == 507, r.text
        detail = r.json()["detail"]
        assert detail.startswith("could not write the database (")
        assert "no space left" in detail.lower()
        if settings.db_url.startswith("sqlite"):  # the database file is in the data dir
            assert str(settings.data_dir.resolve()) in detail
        else:
            assert "the database server's storage" in detail
        health = c.get("/api/health").json()
        assert health["status"] == "degraded" and not health["checks"]["disk"]["ok"]
        assert detail in health["problems"]
        flag.unlink()
        assert c.post("/api/runs", json=SPEC).status_code == 201
