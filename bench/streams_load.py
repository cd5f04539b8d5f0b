"""Streams on a long log against the API and the worker channel (issue 36, items 3 and 4): a
run whose log already holds LINES lines, N live log streams opened on it at once, while a few
clients read the history (`GET /api/runs`) and a played worker posts a log batch and a
heartbeat every 0.5 s through the real worker channel. Three phases side by side in one run,
each on a fresh run with the same backlog: no stream, N streams, N streams with `?rank=7` (no
line has rank 7: they send nothing, as in the issue's report).

    OMP_NUM_THREADS=1 .venv/bin/python bench/streams_load.py [--lines 20000] [--streams 50]
        [--seconds 30] [--db sqlite,postgres] [--root DIR] [--download LINES]

A real `paralab serve` on loopback (the tests' Service harness; no worker process). Prints
per database and phase: history requests, their p50 / p99, the worker's log batches answered
in the window (each waits for the previous answer: ~60 per 30 s when nothing delays them),
their p99 (batch and heartbeat), the backend's CPU seconds in the window (and on PostgreSQL the
database server's, for this database's connections), the stream lines delivered and how long
the last stream took to get its backlog. `--root DIR` runs the backend of another checkout
(e.g. `git archive HEAD | tar -x -C DIR`) to compare with the code before a change.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from devtools.service import (  # noqa: E402 - the harness the tests use
    PG_ADMIN_URL,
    Service,
    fresh_pg_database,
    psycopg_dsn,
)

BATCH_EVERY_S = 0.5
LINES_PER_BATCH = 8
HISTORY_CLIENTS = 4
THINK_S = 0.25  # a history client's pause between requests
TICK = os.sysconf("SC_CLK_TCK")


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def cpu_s(pid: int) -> float:
    """utime + stime of the process (the backend serves in one process); 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


class DbCpu:
    """PostgreSQL: the CPU seconds of the server processes serving this database (the shared
    server also serves other databases; SQLite's work is the backend's own), sampled every
    0.5 s so that the connections a pool opens and closes within the window count too."""

    def __init__(self, db_url: str):
        import psycopg
        self.conn = psycopg.connect(psycopg_dsn(db_url), autocommit=True)
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}

    def sample(self, start: bool = False) -> None:
        for (pid,) in self.conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid()"):
            v = cpu_s(pid)
            # a connection first seen after the start was opened in the window: all its CPU
            self.first.setdefault(pid, v if start else 0.0)
            self.last[pid] = max(v, self.last.get(pid, 0.0))

    async def watch(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await asyncio.to_thread(self.sample)
            await asyncio.sleep(0.5)

    def total(self) -> float:
        self.sample()
        self.conn.close()
        return sum(v - self.first[pid] for pid, v in self.last.items())


async def seed(c: httpx.AsyncClient, run_id: str, lines: int) -> None:
    r = await c.post(f"/api/internal/runs/{run_id}/claim",
                     json={"worker": "bench", "task_id": None})
    assert r.json()["launch"], r.text
    for at in range(0, lines, 1000):  # ~100-character lines of ranks 0-3
        batch = [{"seq": i, "line": f"[rank{i % 4}]: step {i} loss 2.{i:08d} "
                  + "x" * 60} for i in range(at, min(lines, at + 1000))]
        (await c.post(f"/api/internal/runs/{run_id}/logs", json={"lines": batch}))\
            .raise_for_status()


async def stream(url: str, run_id: str, rank: int | None, backlog: int, got: list[int],
                 done_at: list[float], t0: float, stop: asyncio.Event) -> None:
    # counted on the raw bytes, not parsed line by line: the client shares the machine's
    # cores with the backend it measures
    # (`tail`: the end of the previous chunk, too short to hold what is looked for, so that
    # an event split across two chunks is found once)
    n, tail, last = 0, b"\n", f"\nid: {backlog - 1}\n".encode()
    params = {"rank": rank} if rank is not None else {}
    try:
        async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(30, read=None)) as c:
            async with c.stream("GET", f"/api/runs/{run_id}/logs/stream", params=params) as r:
                async for chunk in r.aiter_bytes():
                    n += (tail[-4:] + chunk).count(b"\nid: ")
                    if last in tail + chunk:
                        done_at.append(time.perf_counter() - t0)
                    tail = (tail + chunk)[-(len(last) - 1):]
    except (httpx.HTTPError, asyncio.CancelledError):
        pass
    finally:
        got.append(n)


async def history(url: str, lat: list[float], errors: list[str], stop: asyncio.Event) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=60) as c:
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                r = await c.get("/api/runs", params={"limit": 50})
                if r.status_code != 200:
                    errors.append(f"HTTP {r.status_code}")
            except httpx.HTTPError as exc:
                errors.append(type(exc).__name__)
            lat.append(time.perf_counter() - t0)
            await asyncio.sleep(THINK_S)


async def play_worker(c: httpx.AsyncClient, run_id: str, seq: int, stop: asyncio.Event,
                      lat: list[float]) -> None:
    """A log batch and a heartbeat every BATCH_EVERY_S, each waiting for its answer, as the
    worker's LogShipper and heartbeat do."""
    while not stop.is_set():
        t0 = time.perf_counter()
        lines = [{"seq": seq + k, "line": f"[rank{k % 4}]: live {seq + k}"}
                 for k in range(LINES_PER_BATCH)]
        try:
            r = await c.post(f"/api/internal/runs/{run_id}/logs", json={"lines": lines})
            r.raise_for_status()
            (await c.post(f"/api/internal/runs/{run_id}/heartbeat")).raise_for_status()
        except httpx.HTTPError:
            await asyncio.sleep(BATCH_EVERY_S)
            continue
        if not stop.is_set():
            lat.append(time.perf_counter() - t0)
        seq += LINES_PER_BATCH
        await asyncio.sleep(BATCH_EVERY_S)


async def phase(svc: Service, n_streams: int, rank: int | None, lines: int,
                seconds: float) -> dict:
    run_id = svc.submit({"preset": "ddp", "name": f"streams {n_streams} rank {rank}"})["id"]
    h = {"Authorization": f"Bearer {svc.env['PARALAB_WORKER_TOKEN']}"}
    async with httpx.AsyncClient(base_url=svc.url, timeout=120, headers=h) as worker:
        await seed(worker, run_id, lines)
        stop = asyncio.Event()
        lat, errors, batches, got, done_at = [], [], [], [], []
        pg = DbCpu(svc.env["DATABASE_URL"]) if svc.env["DATABASE_URL"].startswith(
            "postgresql") else None
        if pg:
            pg.sample(start=True)
        cpu0, t0 = cpu_s(svc.backend.pid), time.perf_counter()
        tasks = [asyncio.create_task(stream(svc.url, run_id, rank, lines, got, done_at, t0,
                                            stop)) for _ in range(n_streams)]
        tasks += [asyncio.create_task(history(svc.url, lat, errors, stop))
                  for _ in range(HISTORY_CLIENTS)]
        tasks.append(asyncio.create_task(play_worker(worker, run_id, lines, stop, batches)))
        if pg:
            tasks.append(asyncio.create_task(pg.watch(stop)))
        await asyncio.sleep(seconds)
        stop.set()
        cpu1 = cpu_s(svc.backend.pid)
        db_cpu = pg.total() if pg else float("nan")
        await worker.post(f"/api/internal/runs/{run_id}/finish",
                          json={"status": "succeeded", "exit_code": 0})
        await asyncio.sleep(1)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return {"history": len(lat), "p50_ms": 1e3 * pct(lat, .5), "p99_ms": 1e3 * pct(lat, .99),
            "batches": len(batches), "batch_p99_ms": 1e3 * pct(batches, .99),
            "cpu_s": cpu1 - cpu0, "lines_sent": sum(got),
            "db_cpu_s": db_cpu,
            "replayed_s": max(done_at) if len(done_at) == n_streams and done_at else
            float("nan"), "errors": len(errors)}


def rss_peak_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def downloads(svc: Service, lines: int, n: int = 4) -> dict:
    """`n` downloads at once of a log of `lines` lines (GET .../logs/download; the code before
    issue 36 had none: GET .../logs, which sent the whole log in one answer)."""
    run_id = svc.submit({"preset": "ddp", "name": "a long log"})["id"]
    h = {"Authorization": f"Bearer {svc.env['PARALAB_WORKER_TOKEN']}"}
    async with httpx.AsyncClient(base_url=svc.url, timeout=600, headers=h) as worker:
        await seed(worker, run_id, lines)
    async with httpx.AsyncClient(base_url=svc.url, timeout=600) as c:
        path = f"/api/runs/{run_id}/logs/download"
        async with c.stream("GET", path) as r:
            if r.status_code == 404:
                path = f"/api/runs/{run_id}/logs"

        async def one() -> int:
            size = 0
            async with c.stream("GET", path) as r:
                async for chunk in r.aiter_bytes():
                    size += len(chunk)
            return size

        rss0, t0 = rss_peak_mb(svc.backend.pid), time.perf_counter()
        sizes = await asyncio.gather(*(one() for _ in range(n)))
        return {"path": path.rsplit("/", 1)[1], "downloads": n, "MB_each": sizes[0] / 1e6,
                "s": time.perf_counter() - t0, "rss_peak_before_MB": rss0,
                "rss_peak_after_MB": rss_peak_mb(svc.backend.pid)}


def run_on(db: str, args) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix=f"bench-streams-load-{db}-"))
    drop = None
    if db == "sqlite":
        url = f"sqlite:///{tmp / 'paralab.db'}"
    else:
        url, drop = fresh_pg_database(PG_ADMIN_URL)
    # the 100 history runs stay queued (no worker): the reconciler must not republish them
    # in the middle of a phase, which is another load than the one measured here
    env = {"PARALAB_RUN_HEARTBEAT_TIMEOUT_S": "600", "PARALAB_QUEUE_CLAIM_TIMEOUT_S": "3600"}
    if args.root:
        env["PYTHONPATH"] = str(Path(args.root).resolve())
    if args.replay_reads:
        env["PARALAB_STREAM_REPLAY_READS"] = str(args.replay_reads)
    svc = Service(tmp, db_url=url, redis_url=None, extra_env=env)
    try:
        svc.start_backend()
        for i in range(100):  # a history to list
            svc.submit({"preset": "ddp", "name": f"history {i}"})
        if args.download:
            return {"downloads": asyncio.run(downloads(svc, args.download))}
        out = {}
        for name, n, rank in (("0 streams", 0, None), (f"{args.streams} streams", args.streams,
                                                       None),
                              (f"{args.streams} rank=7", args.streams, 7)):
            out[name] = asyncio.run(phase(svc, n, rank, args.lines, args.seconds))
        return out
    finally:
        svc.close()
        if drop:
            drop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines", type=int, default=20_000)
    ap.add_argument("--streams", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--db", default="sqlite,postgres")
    ap.add_argument("--root", default=None, help="run this checkout's backend")
    ap.add_argument("--download", type=int, default=0, metavar="LINES",
                    help="instead: 4 downloads at once of a log of LINES lines (peak RSS)")
    ap.add_argument("--replay-reads", type=int, default=None,
                    help="PARALAB_STREAM_REPLAY_READS (default: the backend's)")
    args = ap.parse_args()
    print(f"{args.lines} log lines, {HISTORY_CLIENTS} history clients, a worker batch of "
          f"{LINES_PER_BATCH} lines + heartbeat every {BATCH_EVERY_S} s, {args.seconds:g} s "
          f"per phase; backend: {args.root or 'this checkout'}")
    keys = ["history", "p50_ms", "p99_ms", "batches", "batch_p99_ms", "cpu_s", "db_cpu_s",
            "lines_sent", "replayed_s", "errors"]
    for db in args.db.split(","):
        rows = run_on(db, args)
        if args.download:
            print(db, {k: _fmt(v) for k, v in rows["downloads"].items()})
            continue
        print(f"\n{db:<14}" + "".join(f"{name:>16}" for name in rows))
        for k in keys:
            print(f"{k:<14}" + "".join(f"{_fmt(r[k]):>16}" for r in rows.values()))


def _fmt(v) -> str:
    return f"{v:.1f}" if isinstance(v, float) else str(v)


if __name__ == "__main__":
    main()
