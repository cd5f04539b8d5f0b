"""Seconds from submit to `running` and to `succeeded` for a 2-rank, 5-step DDP job, on the
embedded default (filesystem broker + SQLite; with its wake-up and polled only) and on Redis +
PostgreSQL, side by side.

    OMP_NUM_THREADS=1 .venv/bin/python bench/lifecycle.py [--runs 5]

Starts real `paralab serve` + `paralab worker` processes (the tests' Service harness), submits
sequentially, polls the API every 50 ms, and prints median / min / max and the ratio of the two
configurations. Needs Redis and PostgreSQL for the second column (`make test` provisions them).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from devtools.service import (  # noqa: E402 - the harness the tests use
    PG_ADMIN_URL,
    REDIS_URL,
    Service,
    fresh_pg_database,
)

SPEC = {"preset": "ddp", "name": "bench", "train": {"steps": 5}}


def measure(svc: Service, runs: int) -> tuple[list[float], list[float]]:
    to_running, to_done = [], []
    svc.submit({**SPEC, "name": "warm-up"})  # first job pays for cold caches
    svc.wait_status(svc.http.get("/api/runs").json()["items"][0]["id"], "succeeded", 300)
    for _ in range(runs):
        t0 = time.perf_counter()
        run = svc.submit(SPEC)
        running = None
        while True:
            status = svc.run(run["id"])["status"]
            if status != "queued" and running is None:
                running = time.perf_counter() - t0
            if status in ("succeeded", "failed", "cancelled", "timed_out"):
                assert status == "succeeded", svc.run(run["id"])
                break
            time.sleep(0.05)
        to_running.append(running)
        to_done.append(time.perf_counter() - t0)
    return to_running, to_done


def fmt(xs: list[float]) -> str:
    return f"{statistics.median(xs):6.2f} s (min {min(xs):.2f}, max {max(xs):.2f})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as d:
        # the embedded broker with and without its wake-up (PARALAB_BROKER_WAKE), alternated
        # run by run is not possible (one worker each): measured one after the other
        for name, env in (("embedded, woken (default)", {}),
                          ("embedded, polled every 0.5 s", {"PARALAB_BROKER_WAKE": "0"})):
            tmp = Path(d) / str(len(results))
            tmp.mkdir()
            svc = Service(tmp, db_url=f"sqlite:///{tmp}/emb.db", redis_url=None, extra_env=env)
            try:
                svc.start_backend()
                svc.start_worker()
                results[name] = measure(svc, a.runs)
            finally:
                svc.close()
        url, drop = fresh_pg_database(PG_ADMIN_URL)
        (Path(d) / "redis").mkdir()
        svc = Service(Path(d) / "redis", db_url=url, redis_url=REDIS_URL)
        try:
            svc.start_backend()
            svc.start_worker()
            results["Redis + PostgreSQL"] = measure(svc, a.runs)
        finally:
            svc.close()
            drop()
    print(f"{'configuration':32s} {'submit -> running':32s} submit -> succeeded")
    for name, (run, done) in results.items():
        print(f"{name:32s} {fmt(run):32s} {fmt(done)}")
    (w_run, w_done), (p_run, p_done), (r_run, r_done) = results.values()
    med = statistics.median
    print(f"ratio woken / polled: to running {med(w_run) / med(p_run):.2f}, "
          f"to succeeded {med(w_done) / med(p_done):.2f}")
    print(f"ratio embedded (woken) / redis: to running {med(w_run) / med(r_run):.2f}, "
          f"to succeeded {med(w_done) / med(r_done):.2f}")


if __name__ == "__main__":
    main()
