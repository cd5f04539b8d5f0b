"""How long a run that goes wrong takes to reach its verdict, per fault kind, through the real
service (embedded default): from the fault (the rank's flight note / last progress on any rank)
to the run's final report, next to runtime.hang_timeout_s and against a clean run of the same
spec (the ratio).

    OMP_NUM_THREADS=1 .venv/bin/python bench/faults.py [--hang-timeout 4]

A 2-rank dp-allreduce MLP, 5 steps, the fault at step 2. "verdict after stall" is the time from
the last completed step or collective on any rank (the flight files, aligned clock) to the
worker's `finished` report: for a hang it is hang_timeout_s + the stack dump (~2 s) + the stop.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from devtools.service import Service, embedded  # noqa: E402 - the harness the tests use

BASE = {"preset": "dp-allreduce", "model": {"arch": "mlp", "hidden": 8, "layers": 2},
        "train": {"steps": 5, "global_batch": 8, "optimizer": "sgd"}}
FAULTS = {
    "none": None,
    "hang": {"kind": "hang", "ranks": [1], "step": 2, "op": "all_reduce"},
    "skip_collective": {"kind": "skip_collective", "ranks": [1], "step": 2, "op": "all_reduce"},
    "mismatch": {"kind": "mismatch", "ranks": [1], "step": 2, "op": "all_reduce",
                 "mode": "size"},
    "data_exhausted": {"kind": "data_exhausted", "ranks": [1], "step": 2},
    "crash": {"kind": "crash", "ranks": [1], "step": 2},
    "nonfinite": {"kind": "nonfinite", "ranks": [1], "step": 2},
}


def one(svc: Service, fault: dict | None, hang_s: float) -> dict:
    body = {**BASE, "name": f"bench {fault['kind'] if fault else 'clean'}",
            "runtime": {"hang_timeout_s": hang_s}, "faults": [fault] if fault else []}
    t0 = time.perf_counter()
    run = svc.submit(body)
    run = svc.wait_status(run["id"], ("succeeded", "failed", "hung", "timed_out"), 300)
    wall = time.perf_counter() - t0
    while svc.run(run["id"])["summary"] is None:  # a stopped run reports first, uploads after
        time.sleep(0.2)
    flights = [json.loads(p.read_text()) for p in
               (svc.tmp / "var" / "runs" / run["id"]).glob("flight-rank*.json")]
    last = max((f.get("last_progress_ns") or 0) for f in flights) if flights else 0
    finished = datetime.fromisoformat(run["finished_at"]).timestamp()
    return {"status": run["status"], "wall_s": wall,
            "after_stall_s": finished - last / 1e9 if last else None}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hang-timeout", type=float, default=4.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        with embedded(tmp) as svc:
            one(svc, None, args.hang_timeout)  # warm-up
            rows = {k: one(svc, f, args.hang_timeout) for k, f in FAULTS.items()}
    clean = rows["none"]["wall_s"]
    print(f"runtime.hang_timeout_s = {args.hang_timeout:g}; clean run {clean:.1f} s")
    print(f"{'fault':<16} {'status':<9} {'submit->end s':>13} {'x clean':>8} "
          f"{'verdict after stall s':>22}")
    for k, r in rows.items():
        stall = "" if r["after_stall_s"] is None else f"{r['after_stall_s']:.1f}"
        print(f"{k:<16} {r['status']:<9} {r['wall_s']:>13.1f} {r['wall_s'] / clean:>8.2f} "
              f"{stall:>22}")


if __name__ == "__main__":
    main()
