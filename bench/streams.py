"""Many open run pages against one backend (issue 13): N live log streams on a running run
while M clients browse the history (a request, then a pause of 0.5-1.5 s, as a person reading
the page), on the embedded default (SQLite) and on PostgreSQL.

    OMP_NUM_THREADS=1 .venv/bin/python bench/streams.py [--streams 200] [--clients 50]
        [--seconds 20] [--db sqlite,postgres]

A real `paralab serve` (the tests' Service harness; no worker process): the benchmark plays
the worker through the real worker channel — claims the run, then posts a batch of log lines
every 0.5 s, each line carrying its send time — so the lag it prints is the backend's
ingest -> fan-out -> SSE path, end to end over HTTP. Prints per database: history requests
served, their p50 / p99 / max latency, client errors, stream lag p50 / p99 / max, lines
delivered (of lines x streams expected) and broken streams. History requests of the first
WARMUP_S seconds (cold caches, 50 clients connecting at once) are left out of the latencies.
Targets: 0 errors, history p99 < 500 ms, stream lag < 1 s.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from devtools.service import (  # noqa: E402 - the harness the tests use
    PG_ADMIN_URL,
    Service,
    fresh_pg_database,
)

BATCH_EVERY_S = 0.5
WARMUP_S = 3.0  # requests issued in the first seconds (cold caches, clients connecting) not counted
THINK_S = 1.0  # a browsing client's mean pause between requests: 50 clients offer ~50 req/s
LINES_PER_BATCH = 8


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def stream(url: str, run_id: str, lags: list[float], got: list[int], broken: list[str],
                 stop: asyncio.Event, ready: asyncio.Event, opened: list[int]) -> None:
    n = 0
    try:
        async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(30, read=60)) as c:
            async with c.stream("GET", f"/api/runs/{run_id}/logs/stream") as r:
                if r.status_code != 200:
                    broken.append(f"HTTP {r.status_code}")
                    return
                opened.append(1)
                ready.set()
                async for line in r.aiter_lines():
                    if line.startswith("data: bench "):
                        sent = float(line.split()[2])
                        lags.append(time.time() - sent)
                        n += 1
    except (httpx.HTTPError, OSError) as exc:
        if not stop.is_set():
            broken.append(type(exc).__name__)
    finally:
        got.append(n)


async def browse(url: str, lat: list[float], errors: list[str], stop: asyncio.Event,
                 run_ids: list[str]) -> None:
    start = time.perf_counter()
    await asyncio.sleep(THINK_S * 1.5 * random.random())  # people arrive at different times
    async with httpx.AsyncClient(base_url=url, timeout=30) as c:
        i = 0
        while not stop.is_set():
            path = "/api/runs?limit=50" if i % 2 == 0 else f"/api/runs/{run_ids[i % len(run_ids)]}"
            i += 1
            t0 = time.perf_counter()
            try:
                r = await c.get(path)
                if r.status_code != 200:
                    errors.append(f"{path}: HTTP {r.status_code}")
            except httpx.HTTPError as exc:
                errors.append(f"{path}: {type(exc).__name__}")
            if t0 - start >= WARMUP_S:
                lat.append(time.perf_counter() - t0)
            await asyncio.sleep(THINK_S * (0.5 + random.random()))  # a person reads the page


async def play_worker(svc: Service, run_id: str, stop: asyncio.Event, sent: list[int]) -> None:
    """Claim the run and post numbered lines, as worker.tasks.LogShipper does."""
    h = {"Authorization": f"Bearer {svc.env['PARALAB_WORKER_TOKEN']}"}
    async with httpx.AsyncClient(base_url=svc.url, timeout=30, headers=h) as c:
        r = await c.post(f"/api/internal/runs/{run_id}/claim",
                         json={"worker": "bench", "task_id": None})
        assert r.json()["launch"], r.text
        seq = 0
        while not stop.is_set():
            now = time.time()
            lines = [{"seq": seq + k, "ts": datetime.now(UTC).isoformat(),
                      "line": f"bench {now:.6f} line {seq + k}"} for k in range(LINES_PER_BATCH)]
            r = await c.post(f"/api/internal/runs/{run_id}/logs", json={"lines": lines})
            r.raise_for_status()
            (await c.post(f"/api/internal/runs/{run_id}/heartbeat")).raise_for_status()
            seq += LINES_PER_BATCH
            sent.append(LINES_PER_BATCH)
            await asyncio.sleep(BATCH_EVERY_S)
        await c.post(f"/api/internal/runs/{run_id}/finish",
                     json={"status": "succeeded", "exit_code": 0})


async def measure(svc: Service, n_streams: int, n_clients: int, seconds: float) -> dict:
    # a history to browse: 200 queued runs (no worker takes them)
    ids = [svc.submit({"preset": "ddp", "name": f"history {i}"})["id"] for i in range(200)]
    run_id = svc.submit({"preset": "ddp", "name": "the live one"})["id"]
    lags, got, broken, opened, lat, errors, sent = [], [], [], [], [], [], []
    stop, ready = asyncio.Event(), asyncio.Event()
    streams = [asyncio.create_task(stream(svc.url, run_id, lags, got, broken, stop, ready,
                                          opened)) for _ in range(n_streams)]
    t_open = time.perf_counter()
    while len(opened) + len(broken) < n_streams and time.perf_counter() - t_open < 60:
        await asyncio.sleep(0.1)
    open_s = time.perf_counter() - t_open
    worker = asyncio.create_task(play_worker(svc, run_id, stop, sent))
    clients = [asyncio.create_task(browse(svc.url, lat, errors, stop, ids))
               for _ in range(n_clients)]
    await asyncio.sleep(WARMUP_S + seconds)
    stop.set()
    await asyncio.gather(worker, *clients)
    await asyncio.sleep(2)  # the last batch reaches the streams; the end event closes them
    for t in streams:
        t.cancel()
    await asyncio.gather(*streams, return_exceptions=True)
    return {"history": len(lat), "p50_ms": 1e3 * pct(lat, .5), "p99_ms": 1e3 * pct(lat, .99),
            "max_ms": 1e3 * max(lat, default=float("nan")), "errors": len(errors),
            "error_kinds": sorted(set(errors))[:5], "open_s": open_s,
            "lag_p50_ms": 1e3 * pct(lags, .5), "lag_p99_ms": 1e3 * pct(lags, .99),
            "lag_max_ms": 1e3 * max(lags, default=float("nan")),
            "delivered": sum(got), "expected": sum(sent) * n_streams, "broken": len(broken)}


def run_on(db: str, args) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix=f"bench-streams-{db}-"))
    drop = None
    if db == "sqlite":
        url = f"sqlite:///{tmp / 'paralab.db'}"
    else:
        url, drop = fresh_pg_database(PG_ADMIN_URL)
    # the harness's 8 s heartbeat timeout is for tests of lost workers; here a loaded backend
    # must not fail the played run
    svc = Service(tmp, db_url=url, redis_url=None,
                  extra_env={"PARALAB_RUN_HEARTBEAT_TIMEOUT_S": "120"})
    try:
        svc.start_backend()
        return asyncio.run(measure(svc, args.streams, args.clients, args.seconds))
    finally:
        svc.close()
        if drop:
            drop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=200)
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--db", default="sqlite,postgres")
    args = ap.parse_args()
    rows = {db: run_on(db, args) for db in args.db.split(",")}
    print(f"{args.streams} live log streams + {args.clients} clients browsing, "
          f"{args.seconds:g} s, {LINES_PER_BATCH} lines every {BATCH_EVERY_S} s")
    keys = ["history", "p50_ms", "p99_ms", "max_ms", "errors", "open_s", "lag_p50_ms",
            "lag_p99_ms", "lag_max_ms", "delivered", "expected", "broken"]
    print(f"{'':<12}" + "".join(f"{db:>14}" for db in rows))
    for k in keys:
        print(f"{k:<12}" + "".join(f"{_fmt(r[k]):>14}" for r in rows.values()))
    for db, r in rows.items():
        if r["error_kinds"]:
            print(f"{db} errors: {r['error_kinds']}")
    ok = all(r["errors"] == 0 and r["broken"] == 0 and r["p99_ms"] < 500
             and r["lag_max_ms"] < 1000 for r in rows.values())
    print("targets (0 errors, history p99 < 500 ms, stream lag < 1 s):",
          "met" if ok else "NOT met")


def _fmt(v) -> str:
    return f"{v:.1f}" if isinstance(v, float) else str(v)


if __name__ == "__main__":
    main()
