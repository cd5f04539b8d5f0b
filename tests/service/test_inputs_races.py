"""Issue 14, items 7 and 8: what two requests at once must not break, on SQLite and PostgreSQL.
A retried log batch racing its first attempt stores each line once and answers 200 (insert-or-
ignore on (run_id, seq)); 20 simultaneous submissions of a user allowed 1 active run accept
exactly 1. The threads start together (a barrier); nothing here depends on timing."""

from __future__ import annotations

import secrets
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from backend import crud
from backend.core.config import Settings
from backend.core.db import get_sessionmaker
from backend.main import create_app
from backend.models import Run, RunLog
from jobs.spec import parse_spec

WORKER = {"Authorization": "Bearer " + "t" * 32}  # the `settings` fixture's worker token
THREADS = 8


def _together(n: int, call) -> list:
    """`call(i)` from n threads released at once; their results in order."""
    barrier = threading.Barrier(n)

    def one(i):
        barrier.wait()
        return call(i)
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(one, range(n)))


@pytest.fixture
def client(settings):
    with TestClient(create_app(settings), raise_server_exceptions=False) as c:
        yield c


def test_the_same_log_batch_sent_concurrently_is_stored_once(client, settings):
    run_id = client.post("/api/runs", json={"preset": "ddp"}).json()["id"]
    batch = {"lines": [{"seq": i, "line": f"[rank{i % 2}]: line {i}"} for i in range(300)]}
    # Overlapping batches too: each thread sends the whole batch, then a shifted half of it.
    shifted = {"lines": [{"seq": i, "line": f"[rank{i % 2}]: line {i}"}
                         for i in range(150, 450)]}

    def send(i):
        first = client.post(f"/api/internal/runs/{run_id}/logs", json=batch, headers=WORKER)
        second = client.post(f"/api/internal/runs/{run_id}/logs", json=shifted,
                             headers=WORKER)
        return first, second

    answers = [r for pair in _together(THREADS, send) for r in pair]
    assert [r.status_code for r in answers] == [200] * len(answers), \
        [r.text for r in answers if r.status_code != 200][:3]
    # Each line was added by exactly one of the answers, and stored exactly once.
    assert sum(r.json()["added"] for r in answers) == 450
    with get_sessionmaker(settings.db_url)() as db:
        seqs = list(db.scalars(select(RunLog.seq).where(RunLog.run_id == run_id)
                               .order_by(RunLog.seq)))
        ranks = {x.seq: x.rank for x in db.scalars(select(RunLog))}
    assert seqs == list(range(450))
    assert ranks[3] == 1 and ranks[4] == 0
    text = client.get(f"/api/runs/{run_id}/logs").text.splitlines()
    assert text == [f"[rank{i % 2}]: line {i}" for i in range(450)]


def test_append_logs_reports_only_the_new_lines(settings):
    with get_sessionmaker(settings.db_url)() as db:
        run_id = crud.create_run(db, parse_spec({"preset": "ddp"}), owner="local", tags=[],
                                 notes="").id
        out: list = []
        lines = [{"seq": 1, "line": "b"}, {"seq": 0, "line": "a"}, {"seq": 1, "line": "dup"}]
        assert crud.append_logs(db, run_id, lines, out=out) == 2
        assert out == [(0, None, "a"), (1, None, "b")]
        out.clear()
        assert crud.append_logs(db, run_id, lines + [{"seq": 2, "line": "c"}], out=out) == 1
        assert out == [(2, None, "c")]
        assert crud.append_logs(db, run_id, []) == 0


# --- the concurrent-run limit ------------------------------------------------------------------

@pytest.fixture
def team(tmp_path, db_url):
    settings = Settings(data_dir=tmp_path / "var", database_url=db_url, worker_token="w" * 40,
                        auth="required", secret_key=secrets.token_hex(32),
                        argon2_time_cost=1, argon2_memory_kib=1024, argon2_parallelism=1)
    with TestClient(create_app(settings), raise_server_exceptions=False) as c:
        yield c, settings


def _member(settings, name: str, **limits) -> dict:
    with get_sessionmaker(settings.db_url)() as db:
        user = crud.create_user(db, settings, name, "correct horse battery", **limits)
        raw, _ = crud.create_credential(db, user, kind="api", name="test", ttl_s=None)
    return {"Authorization": f"Bearer {raw}"}


def _active(settings, owner: str) -> int:
    with get_sessionmaker(settings.db_url)() as db:
        return db.scalar(select(func.count()).select_from(Run).where(
            Run.owner == owner, Run.status.in_(("queued", "running"))))


def test_twenty_simultaneous_submits_with_limit_one_accept_exactly_one(team):
    client, settings = team
    one = _member(settings, "one", max_concurrent_runs=1)
    answers = _together(20, lambda i: client.post(
        "/api/runs", json={"preset": "ddp", "name": f"r{i}"}, headers=one))
    codes = sorted(r.status_code for r in answers)
    assert codes == [201] + [403] * 19, [r.text for r in answers if r.status_code >= 500][:3]
    assert all("max_concurrent_runs=1" in r.json()["detail"] for r in answers
               if r.status_code == 403)
    assert _active(settings, "one") == 1
    # The refusals left no transaction (nor lock) behind: another user submits at once, and
    # `one` may submit again after cancelling.
    other = _member(settings, "other", max_concurrent_runs=2)
    assert client.post("/api/runs", json={"preset": "ddp"}, headers=other).status_code == 201
    rid = next(r.json()["id"] for r in answers if r.status_code == 201)
    assert client.post(f"/api/runs/{rid}/cancel", headers=one).status_code == 200
    assert client.post("/api/runs", json={"preset": "ddp"}, headers=one).status_code == 201


def test_a_limit_of_three_accepts_three_of_twenty(team):
    client, settings = team
    three = _member(settings, "three", max_concurrent_runs=3)
    answers = _together(20, lambda i: client.post("/api/runs", json={"preset": "ddp"},
                                                  headers=three))
    assert sorted(r.status_code for r in answers) == [201] * 3 + [403] * 17
    assert _active(settings, "three") == 3
