"""Reference vs native engine, step time per model-parallel strategy (issue 4).

    python bench/mp_ref_vs_native.py [--steps 8] [--out /tmp/mp-bench] [--only tp,sp,...]

Runs `python -m jobs.train` under torchrun (gloo, CPU) for each preset twice (engine reference
and native) on the same small GPT and prints the mean step time (steps after the first) and
the ratio reference / native (goal <= 1.15), as a markdown table for docs/benchmarks.md.
Also prints each pipeline run's measured per-stage bubble next to the simulator's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from devtools.launch import torchrun  # noqa: E402
from jobs.analysis import analyze_run_dir  # noqa: E402
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--out", type=Path, default=Path("/tmp/mp-bench"))
    ap.add_argument("--only", default=",".join(PRESETS))
    args = ap.parse_args()
    rows = []
    for preset in args.only.split(","):
        t = {}
        for engine in ("reference", "native"):
            s = run(preset, engine, args.steps, args.out / preset / engine)
            t[engine] = s["mean_step_time_s"]
            pipe = s.get("pipeline", {})
            if pipe.get("p", 1) > 1:  # the analysis' stage table: the bubble's one home
                rows = analyze_run_dir(args.out / preset / engine)["tables"]["stage_bubbles"]
                bub = {r["stage"]: (round(r["measured_idle_fraction"], 3),
                                    r["simulated"] and round(r["simulated"], 3)) for r in rows}
                print(f"  {preset}/{engine} bubble (measured, simulated) per stage: {bub}",
                      flush=True)
        ratio = t["reference"] / t["native"]
        rows.append((preset, t["reference"], t["native"], ratio))
        print(f"{preset}: reference {t['reference'] * 1e3:.1f} ms, native "
              f"{t['native'] * 1e3:.1f} ms, ratio {ratio:.2f}", flush=True)
    print(f"\n{time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs, gloo, GPT {GPT}, "
          f"global batch 16, {args.steps} steps (mean of steps 1..)\n")
    print("| strategy | reference ms/step | native ms/step | ref / native |")
    print("|---|---|---|---|")
    for preset, r, n, q in rows:
        print(f"| {preset} | {r * 1e3:.1f} | {n * 1e3:.1f} | {q:.2f} |")


if __name__ == "__main__":
    main()
