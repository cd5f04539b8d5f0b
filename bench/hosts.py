"""Submit -> every node running, for runs on 1, 2 and 4 hosts, in one run (issue #16): one
backend and four worker processes posing as hosts (their own names, host labels and data
directories, on loopback), real Redis and PostgreSQL, the placement and rendezvous a real
cluster uses. A ddp MLP with one rank per host, so the ranks stay the same size and only the
number of hosts changes.

    OMP_NUM_THREADS=1 .venv/bin/python bench/hosts.py [--repeat 3]

Per layout (median of --repeat runs after a warm-up): submit -> placed (every node reserved;
a one-host run: the run claimed), -> every node claimed by its worker, -> every rank's first
step logged (rendezvous done, process group up), -> the run's final report; and each time as a
ratio to the one-host run. Needs PARALAB_TEST_PG_URL / PARALAB_TEST_REDIS_URL (the test
suite's servers, scripts/provision.sh).
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from devtools.cluster import Cluster  # noqa: E402
from devtools.service import PG_ADMIN_URL, REDIS_URL, fresh_pg_database  # noqa: E402

HOSTS = ("hostA", "hostB", "hostC", "hostD")
STEP = re.compile(r"\[default(\d+)\]:step 0 ")


def body(n: int) -> dict:
    return {"preset": "ddp", "name": f"bench {n} hosts", "parallel": {"dp": n},
            "model": {"hidden": 16, "layers": 2},
            "runtime": {"nnodes": n, "nproc_per_node": 1},
            "train": {"steps": 3, "global_batch": 8}}


def one(c: Cluster, n: int) -> dict:
    t0 = time.perf_counter()
    run_id = c.submit(body(n))["id"]
    marks: dict[str, float] = {}
    while True:
        run = c.run(run_id)
        now = time.perf_counter() - t0
        nodes = run["nodes"]
        if n == 1:
            if run["status"] != "queued":
                marks.setdefault("placed", now)
                marks.setdefault("claimed", now)
        else:
            if len(nodes) == n:
                marks.setdefault("placed", now)
            if len(nodes) == n and all(x["status"] != "reserved" for x in nodes):
                marks.setdefault("claimed", now)
        if "first_step" not in marks:
            ranks = {int(m) for m in STEP.findall(c.http.get(f"/api/runs/{run_id}/logs").text)}
            if ranks >= set(range(n)):
                marks["first_step"] = now
        if run["status"] in ("succeeded", "failed", "cancelled", "timed_out", "hung"):
            assert run["status"] == "succeeded", run["error"]
            marks["finished"] = now
            for k in ("placed", "claimed", "first_step"):
                marks.setdefault(k, now)
            return marks
        time.sleep(0.05)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        url, drop = fresh_pg_database(PG_ADMIN_URL)
        c = Cluster(Path(d), db_url=url, redis_url=REDIS_URL)
        try:
            c.start_backend()
            for h in HOSTS:
                c.start_host(h, ranks=1, slots=1)
            one(c, 1)  # warm-up: imports, page cache
            rows = {n: [one(c, n) for _ in range(args.repeat)] for n in (1, 2, 4)}
        finally:
            c.close()
            drop()
    keys = ("placed", "claimed", "first_step", "finished")
    med = {n: {k: statistics.median(r[k] for r in rs) for k in keys} for n, rs in rows.items()}
    print(f"ddp MLP, 1 rank per host, 3 steps; median of {args.repeat} runs per layout")
    print(f"{'hosts':>5} " + " ".join(f"{k + ' s':>12} {'x 1 host':>8}" for k in keys))
    for n, m in med.items():
        print(f"{n:>5} " + " ".join(f"{m[k]:>12.2f} {m[k] / med[1][k]:>8.2f}" for k in keys))


if __name__ == "__main__":
    main()
