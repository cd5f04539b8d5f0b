"""What a rank pays before its first step: the CPU seconds of a fresh interpreter that imports
the train job and takes one optimizer step, with the reference engines' optimizer
(jobs/parallel/optim.EagerOptimizer: torch's functional Adam) against torch.optim.Adam's class
(what they used before: it imports torch._dynamo, and with it DTensor and sympy), alternated
run by run. A bare `import torch` is the floor. Then a whole launch, the agent included: the
2-rank ddp preset for 3 steps through `python -m torch.distributed.run` and through
`python -m jobs.torchrun` (the same launcher, leaving without the interpreter's teardown, as the
worker launches jobs) with every rank its own interpreter and with the ranks forked from the
agent (jobs/torchrun.py's warm ranks, the default for jobs.train), alternated.

    OMP_NUM_THREADS=1 .venv/bin/python bench/rank_startup.py [--runs 5]

Prints each arm's median CPU seconds (user + system of the child and what it reaped) and, for the
launches, wall seconds, the differences and ratios, with the load average."""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

STEP = ("import sys, torch, jobs.train\n"
        "p = torch.nn.Parameter(torch.zeros(1000))\n"
        "p.grad = torch.ones(1000)\n")
ARMS = {
    "import torch": "import torch\n",
    "torch.optim.Adam": STEP + "o = torch.optim.Adam([p], lr=0.1)\no.step()\n",
    "EagerOptimizer": STEP + "from jobs.parallel.optim import EagerOptimizer\n"
                             "o = EagerOptimizer([p], 'adam', 0.1)\no.step()\n",
}


def measured(argv: list[str], env: dict | None = None) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of `argv` and every process it reaped."""
    before, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    subprocess.run(argv, cwd=ROOT, check=True, stdout=subprocess.DEVNULL,
                   env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT),
                        **(env or {})})
    wall, after = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def cpu_of(code: str) -> float:
    return measured([sys.executable, "-c", code])[0]


def launches(runs: int) -> None:
    sys.path.insert(0, str(ROOT))
    from devtools.launch import free_port
    from jobs.spec import parse_spec

    with tempfile.TemporaryDirectory() as d:
        spec = Path(d) / "spec.json"
        spec.write_text(json.dumps(parse_spec({"preset": "ddp", "train": {"steps": 3}})
                                   .to_dict()))
        # (module, PARALAB_RANK_START): torch's launcher; ours with every rank exec'd as
        # torchrun does; ours with the ranks forked from the agent (the default for jobs.train)
        arms = {"torch.distributed.run": ("torch.distributed.run", "exec"),
                "jobs.torchrun, exec'd ranks": ("jobs.torchrun", "exec"),
                "jobs.torchrun, forked ranks": ("jobs.torchrun", "")}
        got: dict[str, list[tuple[float, float]]] = {k: [] for k in arms}
        for _ in range(runs):
            for k, (module, start) in arms.items():
                got[k].append(measured([
                    sys.executable, "-m", module, "--nproc-per-node", "2", "--master-addr",
                    "127.0.0.1", "--master-port", str(free_port()), "-m", "jobs.train",
                    "--spec", str(spec), "--out", f"{d}/{len(got[k])}-{module}-{start}"],
                    {"PARALAB_RANK_START": start}))
    med = {k: (statistics.median(c for c, _ in v), statistics.median(w for _, w in v))
           for k, v in got.items()}
    for k, (c, w) in med.items():
        print(f"{k:>28}: median {c:.2f} CPU-s, {w:.2f} s wall")
    c0, w0 = med["torch.distributed.run"]
    for k in list(arms)[1:]:
        c1, w1 = med[k]
        print(f"{k} - torch.distributed.run: {c1 - c0:+.2f} CPU-s ({c1 / c0:.2f}x), "
              f"{w1 - w0:+.2f} s wall ({w1 / w0:.2f}x)")
    print(f"load average {os.getloadavg()[0]:.1f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    cpu_of(ARMS["import torch"])  # warm the page cache and the .pyc files
    got: dict[str, list[float]] = {k: [] for k in ARMS}
    for _ in range(a.runs):  # alternated, so load drifts hit every arm alike
        for name, code in ARMS.items():
            got[name].append(cpu_of(code))
    med = {k: statistics.median(v) for k, v in got.items()}
    for name, v in got.items():
        runs = ", ".join(f"{x:.2f}" for x in v)
        print(f"{name:>18}: median {med[name]:.2f} CPU-s  (runs {runs})")
    cls, eager = med["torch.optim.Adam"], med["EagerOptimizer"]
    print(f"EagerOptimizer - class: {eager - cls:+.2f} CPU-s per rank ({eager / cls:.2f}x); "
          f"load average {os.getloadavg()[0]:.1f}")
    launches(a.runs)


if __name__ == "__main__":
    main()
