"""bench/service_overhead.py's timeline: where an API run's time went, from the run's own
timestamps (naive UTC from the backend's SQLite, aware ones from the worker's log lines),
against a hand-made run."""

import importlib.util
import sqlite3
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("service_overhead",
                                                  ROOT / "bench" / "service_overhead.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_stages_are_the_gaps_between_the_runs_own_timestamps(tmp_path):
    db = tmp_path / "p.db"
    with sqlite3.connect(db) as c:
        c.execute("CREATE TABLE runs (id TEXT, created_at TEXT, started_at TEXT, "
                  "finished_at TEXT)")
        c.execute("CREATE TABLE run_logs (run_id TEXT, seq INT, ts TEXT, line TEXT)")
        c.execute("INSERT INTO runs VALUES ('r', '2026-12-07 10:00:00.000000', "
                  "'2026-12-07 10:00:00.500000', '2026-12-07 10:00:03.100000')")
        c.executemany("INSERT INTO run_logs VALUES ('r', ?, ?, ?)", [
            (1, "2026-12-07T10:00:00.700000+00:00", "[paralab] launching on h: python ..."),
            (2, "2026-12-07T10:00:01.000000+00:00", "[default0]:hello"),
            (3, "2026-12-07T10:00:02.000000+00:00", "[paralab] finished: succeeded (exit "
                                                    "code 0)"),
            (4, "2026-12-07T10:00:02.500000+00:00", "[paralab] launching is not a prefix "
                                                    "read twice")])
    got = _bench().timeline(db, "r")
    want = [0.5, 0.2, 1.3, 1.1]  # by hand: 0.5 queued, 0.7 launch, 2.0 exit, 3.1 succeeded
    assert list(got) == list(_bench().STAGES)
    assert list(got.values()) == pytest.approx(want, abs=1e-6)
