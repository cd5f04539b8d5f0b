"""What the service adds to a run: the same 2-rank ddp job as a bare `torchrun` and through
paralab (POST /api/runs and waiting on the run's event stream; `paralab submit --wait`),
alternated run by run on one machine, at a few step counts.

    OMP_NUM_THREADS=1 .venv/bin/python bench/service_overhead.py [--steps 5 2000] [--runs 3]

Bare: `python -m torch.distributed.run --standalone --nproc-per-node 2 -m jobs.train` with
the spec the service stored for the same job (so both train the same thing), its wall time
from start to exit: what a user runs by hand. Same launch: `python -m jobs.torchrun` with the
same arguments, the worker's launcher (its ranks fork from the agent, jobs/torchrun.py), so
"service - same launch" is what the service itself adds. API: submit to `succeeded` as a
client sees it (the Service harness's wait_status: woken by GET /live). CLI: the `paralab
submit --wait` process's wall time. Prints each median, the overhead (service - bare) and the
ratio, the service less the same launch, with the load average; then where an API run's
time went (`timeline`: the run's own timestamps, medians over the API runs)."""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from devtools.service import Service, embedded  # noqa: E402 - the harness the tests use

BASE = {"preset": "ddp", "name": "overhead"}


def bare(spec: dict, tmp: Path, launcher: str = "torch.distributed.run") -> float:
    out = tmp / f"bare-{time.monotonic_ns()}"
    out.mkdir()
    (out / "spec.json").write_text(json.dumps(spec))
    argv = [sys.executable, "-m", launcher, "--standalone", "--nnodes", "1",
            "--nproc-per-node", str(spec["runtime"]["nproc_per_node"]), "-m", "jobs.train",
            "--spec", str(out / "spec.json"), "--out", str(out)]
    t0 = time.perf_counter()
    subprocess.run(argv, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def api(svc: Service, body: dict, ids: list[str] | None = None) -> float:
    t0 = time.perf_counter()
    run = svc.submit(body)
    done = svc.wait_status(run["id"], ("succeeded", "failed", "cancelled", "timed_out"), 900)
    assert done["status"] == "succeeded", done
    if ids is not None:
        ids.append(run["id"])
    return time.perf_counter() - t0


STAGES = ("queued: submit to claimed", "claimed to launch", "launch to job exit",
          "job exit to succeeded")


def timeline(db: Path, run_id: str) -> dict[str, float]:
    """One run's stages from its own timestamps: the backend's created / started / finished
    and the worker's log lines "[paralab] launching" and "[paralab] finished" (one machine,
    one clock)."""
    def t(text: str) -> float:  # SQLite keeps the backend's UTC times naive
        d = datetime.fromisoformat(text)
        return (d if d.tzinfo else d.replace(tzinfo=UTC)).timestamp()

    with sqlite3.connect(db) as c:
        created, started, finished = c.execute(
            "SELECT created_at, started_at, finished_at FROM runs WHERE id = ?",
            (run_id,)).fetchone()
        lines = c.execute("SELECT ts, line FROM run_logs WHERE run_id = ? ORDER BY seq",
                          (run_id,)).fetchall()
    launch = next(t(ts) for ts, line in lines if line.startswith("[paralab] launching"))
    ended = next(t(ts) for ts, line in lines if line.startswith("[paralab] finished:"))
    points = [t(created), t(started), launch, ended, t(finished)]
    return {name: b - a for name, a, b in zip(STAGES, points[:-1], points[1:],
                                                     strict=True)}


def cli(svc: Service, body: dict, tmp: Path) -> float:
    path = tmp / "cli-spec.json"
    path.write_text(json.dumps({**body, "runtime": {"queue": svc.queue}}))
    env = {**svc.env, "PARALAB_URL": svc.url}
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "backend.cli", "submit", str(path), "--wait"],
                   cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, nargs="+", default=[5, 2000])
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    med = statistics.median
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        with embedded(tmp) as svc:
            print(f"{'steps':>6} {'bare s':>8} {'same s':>8} {'API s':>8} {'CLI s':>8} "
                  f"{'API +s':>8} {'CLI +s':>8} {'API x':>6} {'CLI x':>6} {'API-same':>9} "
                  f"{'CLI-same':>9}  load")
            for steps in a.steps:
                body = {**BASE, "train": {"steps": steps}}
                first = svc.submit(body)  # warm-up, and the stored spec the bare run uses
                spec = svc.wait_status(first["id"], "succeeded", 900)["spec"]
                got: dict[str, list[float]] = {"bare": [], "same": [], "api": [], "cli": []}
                ids: list[str] = []
                for _ in range(a.runs):  # alternated, so load drifts hit every arm alike
                    got["bare"].append(bare(spec, tmp))
                    got["same"].append(bare(spec, tmp, "jobs.torchrun"))
                    got["api"].append(api(svc, body, ids))
                    got["cli"].append(cli(svc, body, tmp))
                b, w, p, c = (med(got[k]) for k in ("bare", "same", "api", "cli"))
                print(f"{steps:6d} {b:8.2f} {w:8.2f} {p:8.2f} {c:8.2f} {p - b:+8.2f} "
                      f"{c - b:+8.2f} {p / b:6.2f} {c / b:6.2f} {p - w:+9.2f} {c - w:+9.2f}  "
                      f"{os.getloadavg()[0]:.1f}")
                stages = [timeline(tmp / "p.db", i) for i in ids]
                print("       timeline of the API runs (medians): " + "; ".join(
                    f"{k} {med(x[k] for x in stages):.2f} s" for k in STAGES) +
                    f"; seen by the client {p - med(sum(x.values()) for x in stages):+.2f} s")


if __name__ == "__main__":
    main()
