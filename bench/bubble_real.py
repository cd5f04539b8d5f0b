"""Pipeline bubbles on real compute against the closed form (p-1)/(v*m+p-1), p = 2: GPipe,
1F1B and interleaved 1F1B (a benchmark: wall-clock figures are printed, never asserted; the
tests check the schedules deterministically, tests/mp/test_pipeline.py).

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python bench/bubble_real.py [--steps 10]

Two ranks on two cores each own a core, so wall-clock bubbles mean something here. The stages do
equal matrix work: an MLP of 32 identical 512 x 512 layers split 16 / 16 (8 per chunk
interleaved), micro-batches of 256 rows, about 20 ms of forward per stage; the input batch
requires a gradient so the first stage's backward is as long as the others'
(bench/bubble_real_worker.py). A step in which a rank lost its core while computing (its
thread's CPU time below its compute spans' wall time: last column) was disturbed. The bubble per
(step, rank)
is jobs.analysis's (pipeline idle / pipeline window, docs/analysis.md).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from devtools.launch import run_worker  # noqa: E402
from devtools.oracle.steps import step_rank_table  # noqa: E402
from jobs import schedules  # noqa: E402
from jobs.analysis.storage.load import load_run_dir  # noqa: E402

P, HIDDEN, LAYERS, MB = 2, 512, 32, 256


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        out = Path(d)
        res = run_worker(ROOT / "bench" / "bubble_real_worker.py", P, out, str(HIDDEN),
                         str(LAYERS), str(MB), str(args.steps), timeout=900)
        print(f"p = {P}, mlp {LAYERS} x {HIDDEN}x{HIDDEN}, micro-batch {MB}, gloo CPU, "
              f"steps 1..{args.steps - 1}\n")
        print("| schedule | m | v | closed form | stage | measured (median over steps) | "
              "measured (shortest step) | CPU / busy (median) |")
        print("|---|---|---|---|---|---|---|---|")
        for schedule, case in res["cases"].items():
            m, v, cpu = case["m"], case["v"], case["cpu_s"]
            rows = [r for r in step_rank_table(load_run_dir(out / schedule))
                    if r.get("pipeline_window_s") and r["step"] >= 1]
            closed = schedules.closed_form_bubble(schedule, P, m, v)
            for stage in range(P):
                mine = [r for r in rows if int(r["pp"] or 0) == stage]
                frac = {r["step"]: r["pipeline_idle_s"] / r["pipeline_window_s"] for r in mine}
                win = {r["step"]: r["pipeline_window_s"] for r in mine}
                ratio = [cpu[str(r["rank"])][r["step"]]
                         / max(r["pipeline_window_s"] - r["pipeline_idle_s"], 1e-9) for r in mine]
                print(f"| {schedule} | {m} | {v} | {closed:.3f} | {stage} | "
                      f"{statistics.median(frac.values()):.3f} | {frac[min(win, key=win.get)]:.3f}"
                      f" | {statistics.median(ratio):.2f} |")

if __name__ == "__main__":
    main()
