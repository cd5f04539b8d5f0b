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
ratio, the service less the same launch, with the load average."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
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


def api(svc: Service, body: dict) -> float:
    t0 = time.perf_counter()
    run = svc.submit(body)
    done = svc.wait_status(run["id"], ("succeeded", "failed", "cancelled", "timed_out"), 900)
    assert done["status"] == "succeeded", done
    return time.perf_counter() - t0


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
                for _ in range(a.runs):  # alternated, so load drifts hit every arm alike
                    got["bare"].append(bare(spec, tmp))
                    got["same"].append(bare(spec, tmp, "jobs.torchrun"))
                    got["api"].append(api(svc, body))
                    got["cli"].append(cli(svc, body, tmp))
                b, w, p, c = (med(got[k]) for k in ("bare", "same", "api", "cli"))
                print(f"{steps:6d} {b:8.2f} {w:8.2f} {p:8.2f} {c:8.2f} {p - b:+8.2f} "
                      f"{c - b:+8.2f} {p / b:6.2f} {c / b:6.2f} {p - w:+9.2f} {c - w:+9.2f}  "
                      f"{os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
