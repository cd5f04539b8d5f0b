"""Runs list at scale (issue 7): 10,000 stored runs, a filtered page, server time.

Fills a fresh, migrated database with N runs (a realistic mix of strategies, statuses, owners,
tags, names; the full spec and summary of every run stored as the service stores them) and
times GET /api/runs for the dashboard's queries, in process through the ASGI app (server time:
routing, query, serialisation; no network). SQLite always; PostgreSQL too when reachable at
PARALAB_TEST_PG_URL (default postgresql+psycopg://postgres@127.0.0.1:5432/test; a temporary
database is created and dropped).

    .venv/bin/python bench/runs_list.py [--runs 10000] [--repeat 15]
"""

from __future__ import annotations

import argparse
import os
import random
import secrets
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fastapi.testclient import TestClient  # noqa: E402

from backend.core.config import Settings  # noqa: E402
from backend.core.db import get_engine, get_sessionmaker  # noqa: E402
from backend.main import create_app  # noqa: E402
from backend.migrate import upgrade  # noqa: E402
from backend.models import Run, RunTag, metric_values, utcnow  # noqa: E402
from jobs.spec import parse_spec  # noqa: E402

PG_URL = os.environ.get("PARALAB_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
PRESETS = ["ddp", "zero1", "zero2", "zero3", "fsdp", "tp", "sp", "pp-gpipe", "pp-1f1b", "3d",
           "collective-sweep"]
STATUSES = ["succeeded"] * 6 + ["failed", "cancelled", "running", "queued"]
QUERIES = {
    "first page, newest first": {"limit": 50},
    "status=succeeded": {"status": "succeeded", "limit": 50},
    "strategy=zero2,zero3 + status": {"strategy": "zero2,zero3", "status": "succeeded",
                                      "limit": 50},
    "text search q=sweep-b": {"q": "sweep-b", "limit": 50},
    "tag=baseline": {"tag": "baseline", "limit": 50},
    "owner + sort=name": {"owner": "alice", "sort": "name", "limit": 50},
    "sort=step_time_s (fastest first)": {"sort": "step_time_s", "limit": 50},
    "sort=-peak_memory_bytes + max_peak": {"sort": "-peak_memory_bytes",
                                           "max_peak_memory_bytes": 2e9, "limit": 50},
}


def fill(url: str, n: int) -> None:
    specs = {p: parse_spec({"preset": p}, max_world_size=64).to_dict() for p in PRESETS}
    rng = random.Random(0)
    t0 = utcnow() - timedelta(days=60)
    maker = get_sessionmaker(url)
    with maker() as db:
        for start in range(0, n, 1000):
            runs, tags = [], []
            for i in range(start, min(n, start + 1000)):
                p = rng.choice(PRESETS)
                spec = specs[p]
                par = spec["parallel"]
                status = rng.choice(STATUSES)
                rid = secrets.token_hex(6)
                head = {"step_time_s": rng.random(), "peak_memory_bytes": rng.randint(1, 8) * 10**9,
                        "tokens_per_s": rng.random() * 1e5, "final_loss": rng.random()}
                summary = ({"headline": head, "loss": [1.0] * 20}
                           if status == "succeeded" else None)
                runs.append(dict(
                    id=rid, name=f"{p} sweep-{'abcdefgh'[i % 8]} #{i}", owner=rng.choice(
                        ["alice", "bob", "carol", "dave", "local"]), kind=spec["kind"],
                    strategy=parse_spec(spec).strategy, spec=spec, spec_version=1,
                    world_size=spec["runtime"]["nproc_per_node"], dp=par["dp"], tp=par["tp"],
                    pp=par["pp"], queue="default", status=status,
                    created_at=t0 + timedelta(seconds=500 * i), cancel_requested=False,
                    notes="" if i % 3 else "baseline comparison", summary=summary,
                    metrics=(summary or {}).get("headline"),
                    **metric_values((summary or {}).get("headline"), None, None)))
                for t in rng.sample(["baseline", "ablation", "gpu", "nightly"], rng.randint(0, 2)):
                    tags.append({"run_id": rid, "tag": t})
            db.execute(Run.__table__.insert(), runs)
            if tags:
                db.execute(RunTag.__table__.insert(), tags)
            db.commit()


def measure(url: str, n: int, repeat: int, label: str) -> list[tuple]:
    upgrade(url)
    t = time.perf_counter()
    fill(url, n)
    print(f"[{label}] inserted {n} runs in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    settings = Settings(data_dir=Path(tempfile.mkdtemp()), database_url=url,
                        worker_token="t" * 32)
    rows = []
    with TestClient(create_app(settings)) as client:
        for name, params in QUERIES.items():
            times, cpu = [], []
            for _ in range(repeat + 2):
                t, c = time.perf_counter(), time.process_time()
                r = client.get("/api/runs", params=params)
                times.append(time.perf_counter() - t)
                cpu.append(time.process_time() - c)
                assert r.status_code == 200, r.text
            page = r.json()
            times, cpu = times[2:], cpu[2:]  # warm-up (connection, statement caches)
            rows.append((label, name, len(page["items"]), statistics.median(times) * 1e3,
                         max(times) * 1e3, statistics.median(cpu) * 1e3))
        cursor, params = None, {"status": "succeeded", "limit": 50}
        for _ in range(20):  # a deep page: follow the cursor 20 pages in, then time that page
            cursor = client.get("/api/runs", params={**params, **(
                {"cursor": cursor} if cursor else {})}).json()["next_cursor"]
        times, cpu = [], []
        for _ in range(repeat):
            t, c = time.perf_counter(), time.process_time()
            r = client.get("/api/runs", params={**params, "cursor": cursor})
            times.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
        rows.append((label, "status=succeeded, page 21 (cursor)", len(r.json()["items"]),
                     statistics.median(times) * 1e3, max(times) * 1e3,
                     statistics.median(cpu) * 1e3))
    get_engine(url).dispose()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=15)
    args = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        results += measure(f"sqlite:///{tmp}/runs.db", args.runs, args.repeat, "SQLite")
    try:
        import psycopg
        from sqlalchemy.engine import make_url
        admin = PG_URL.replace("postgresql+psycopg://", "postgresql://", 1)
        name = f"paralab_bench_{secrets.token_hex(4)}"
        with psycopg.connect(admin, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        try:
            url = make_url(PG_URL).set(database=name).render_as_string(hide_password=False)
            results += measure(url, args.runs, args.repeat, "PostgreSQL")
        finally:
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    except Exception as exc:  # noqa: BLE001 - reported: the SQLite figures still stand
        print(f"PostgreSQL skipped: {exc}", file=sys.stderr)
    print(f"load average {os.getloadavg()[0]:.1f}; CPU = process CPU time of the request "
          "(server and in-process client), the figure to read on a shared machine")
    print(f"| database | query ({args.runs:,} runs) | rows | median ms | max ms | CPU ms |")
    print("|---|---|---|---|---|---|")
    for label, name, count, med, mx, c in results:
        print(f"| {label} | {name} | {count} | {med:.1f} | {mx:.1f} | {c:.1f} |")


if __name__ == "__main__":
    main()
