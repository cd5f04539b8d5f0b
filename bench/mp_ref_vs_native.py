"""Reference vs native engine, step time per model-parallel strategy (issue 4).

    python bench/mp_ref_vs_native.py [--steps 8] [--trials 3] [--out /tmp/mp-bench]
                                     [--only tp,sp,...]

Runs `python -m jobs.train` under torchrun (gloo, CPU) for each preset with engine reference and
native on the same small GPT, `--trials` times, the engines' order alternating trial by trial
(the machine's noise falls on both). A trial's figure is the median step time of its steps
after the first (a mean let one slow step of a few-ms pipeline step swing the ratio from 0.5 to
2.7); printed per preset: each engine's median over the trials, the ratio of the medians
(goal <= 1.15), and each trial's own ratio with their spread about the median ratio (goal: under
+-15 %), as a markdown table for docs/benchmarks.md. Also prints each pipeline run's measured
per-stage bubble next to the simulator's (its first trial).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from devtools.launch import torchrun  # noqa: E402
from jobs.analysis import analyze_folder  # noqa: E402
from jobs.spec import parse_spec  # noqa: E402

GPT = {"arch": "gpt", "layers": 4, "hidden": 64, "heads": 4, "seq_len": 32, "vocab": 256}
PRESETS = ("tp", "sp", "pp-gpipe", "pp-1f1b", "pp-interleaved", "pp-zb", "pp-zbv", "3d",
           "tp+vocab")
# names that are a preset plus parallel overrides
VARIANTS = {"tp+vocab": ("tp", {"vocab_parallel": True})}



def run(name: str, engine: str, steps: int, out: Path) -> dict:
    preset, extra = VARIANTS.get(name, (name, {}))
    spec = parse_spec({"preset": preset, "model": GPT,
                       "parallel": {"engine": engine, **extra, **({"microbatches": 4}
                                                                  if preset.startswith("pp")
                                                                  else {})},
                       "train": {"steps": steps, "global_batch": 16}})
    out.mkdir(parents=True, exist_ok=True)
    (out / "spec.json").write_text(json.dumps(spec.to_dict()))
    p = torchrun(spec.world_size, ["-m", "jobs.train", "--spec", str(out / "spec.json"),
                                   "--out", str(out)], timeout=900)
    if p.returncode:
        raise SystemExit(f"{name}/{engine} failed:\n{p.stderr[-3000:]}")
    return json.loads((out / "summary.json").read_text())


def steady_s(summary: dict) -> float:
    """The median step time after the first step (which pays the start-up)."""
    return statistics.median(summary["step_time_s"][1:])


def spread(ratios: list[float]) -> float:
    """The largest distance of a trial's ratio from their median, as a fraction of it."""
    mid = statistics.median(ratios)
    return max(abs(r / mid - 1) for r in ratios)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("/tmp/mp-bench"))
    ap.add_argument("--only", default=",".join(PRESETS))
    args = ap.parse_args()
    table = []
    for preset in args.only.split(","):
        t: dict[str, list[float]] = {"reference": [], "native": []}
        for trial in range(args.trials):
            engines = ("reference", "native") if trial % 2 == 0 else ("native", "reference")
            for engine in engines:
                out = args.out / preset / engine / str(trial)
                s = run(preset, engine, args.steps, out)
                t[engine].append(steady_s(s))
                if trial == 0 and s.get("pipeline", {}).get("p", 1) > 1:
                    # the analysis' stage table: the bubble's one home
                    stages = analyze_folder(out)["tables"]["stage_bubbles"]
                    bub = {r["stage"]: (round(r["measured_idle_fraction"], 3),
                                        r["simulated"] and round(r["simulated"], 3))
                           for r in stages}
                    print(f"  {preset}/{engine} bubble (measured, simulated) per stage: {bub}",
                          flush=True)
        ratios = [r / n for r, n in zip(t["reference"], t["native"], strict=True)]
        ref, nat = statistics.median(t["reference"]), statistics.median(t["native"])
        table.append((preset, ref, nat, ref / nat, ratios))
        print(f"{preset}: reference {ref * 1e3:.1f} ms, native {nat * 1e3:.1f} ms, ratio "
              f"{ref / nat:.2f}, per trial {', '.join(f'{q:.2f}' for q in ratios)}", flush=True)
    print(f"\n{time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs, gloo, GPT {GPT}, "
          f"global batch 16, {args.steps} steps, median of steps 1.., {args.trials} trials "
          "alternated\n")
    print("| strategy | reference ms/step | native ms/step | ref / native | per trial | spread |")
    print("|---|---|---|---|---|---|")
    for preset, r, n, q, ratios in table:
        print(f"| {preset} | {r * 1e3:.1f} | {n * 1e3:.1f} | {q:.2f} | "
              f"{', '.join(f'{x:.2f}' for x in ratios)} | ±{spread(ratios) * 100:.0f} % |")


if __name__ == "__main__":
    main()
