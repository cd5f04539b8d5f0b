"""A full disk on the backend (issue 14, item 6), on a real backend, Celery worker, Redis and
torchrun. A test cannot fill a disk here, so the backend runs with the test-only fault
injection of backend/storage.py: while a flag file exists, its database and run-file writes
fail as on a full disk (ENOSPC; "database or disk is full" from SQLite).

Filled mid-run: submit answers 507 with words, health is degraded, the job fails (a rank is
killed: exit code != 0) while none of the worker's reports can be stored, long enough for the
run's heartbeats to go stale; once space is back the run keeps the job's exit code and cause,
not "worker lost"."""

from __future__ import annotations

import os
import signal
from datetime import UTC, datetime

import pytest
from sqlalchemy import create_engine, text

from tests.conftest import REDIS_URL, Service, wait_for
from worker.hang import rank_pids
from worker.procs import proc_key

pytestmark = pytest.mark.slow

LONG = {"preset": "ddp", "name": "long", "train": {"steps": 100_000},
        "model": {"arch": "timed", "layers": 2, "hidden": 16, "t_forward": 0.02,
                  "t_backward_input": 0.02, "t_backward_weight": 0.02}}


def _heartbeat_age_s(db_url: str, run_id: str) -> float:
    engine = create_engine(db_url)
    try:
        with engine.connect() as c:
            at = c.execute(text("SELECT heartbeat_at FROM runs WHERE id = :i"),
                           {"i": run_id}).scalar_one()
    finally:
        engine.dispose()
    at = datetime.fromisoformat(str(at)).replace(tzinfo=UTC)
    return (datetime.now(UTC) - at).total_seconds()


def _a_rank(run_id: str) -> int:
    """A rank, as the worker's hang watch finds it (its ranks come from a fork server, so a
    child of torchrun may be that server)."""
    return rank_pids(proc_key(run_id))[0]


def test_disk_full_mid_run_keeps_the_jobs_exit_code(tmp_path):
    flag = tmp_path / "disk-full"
    db_url = f"sqlite:///{tmp_path / 'p.db'}"
    svc = Service(tmp_path, db_url=db_url, redis_url=REDIS_URL,
                  extra_env={"PARALAB_TEST_DISK_FULL_FLAG": str(flag)})
    try:
        svc.start_backend()
        svc.start_worker()
        run = svc.submit(LONG)
        svc.wait_status(run["id"], "running", 60)
        wait_for(lambda: len(rank_pids(proc_key(run["id"]))) >= 2, 60, "the job's ranks")
        flag.touch()  # the disk is full from now on

        refused = svc.http.post("/api/runs", json={**LONG, "runtime": {"queue": svc.queue}})
        assert refused.status_code == 507, refused.text
        detail = refused.json()["detail"]
        assert detail.startswith("could not write the database (sqlite:///")
        assert str((tmp_path / "var").resolve()) in detail and "no space left" in detail
        health = svc.http.get("/api/health").json()
        assert health["status"] == "degraded" and not health["checks"]["disk"]["ok"]
        assert "no space left" in health["checks"]["disk"]["last_write_error"]

        os.kill(_a_rank(run["id"]), signal.SIGKILL)  # the job fails: torchrun exits non-zero
        worker_log = tmp_path / "worker.log"
        wait_for(lambda: f"/api/internal/runs/{run['id']}/finish failed (507" in
                 worker_log.read_text(errors="replace"), 120,
                 "the worker to retry its finish report against the full disk")
        # the run's heartbeats cannot be stored either: wait until they are older than the
        # reaper's timeout (8 s in the Service fixture), as in the reported case
        wait_for(lambda: _heartbeat_age_s(db_url, run["id"]) > 10, 60,
                 "the run's heartbeat to go stale")
        assert svc.run(run["id"])["status"] == "running"
        flag.unlink()  # space again

        done = svc.wait_status(run["id"], ("failed", "succeeded", "cancelled"), 120)
        assert done["status"] == "failed", done
        assert done["exit_code"] not in (None, 0), done
        assert not done["error"].startswith("worker lost"), done["error"]
        assert svc.submit(LONG | {"train": {"steps": 1}})["status"] == "queued"
    finally:
        flag.unlink(missing_ok=True)
        svc.close()
