"""Expert and context parallelism against their own ep = 1 / cp = 1 layouts (issue 17).

    python bench/ep_cp.py [--steps 6] [--out /tmp/ep-cp-bench]

Neither has a native PyTorch counterpart that runs here, so there is no reference / native
ratio to print: PyTorch ships no expert-parallel module (torchtitan's and Megatron's are
their own code, as paralab's jobs/parallel/expert.py is), and
`torch.distributed.tensor.experimental.context_parallel` shards only the CUDA flash /
efficient SDPA kernels (on CPU it raises "aten._scaled_dot_product_flash_attention_for_cpu
does not have a sharding strategy registered"; jobs/spec.py refuses engine "native" with
cp > 1 quoting it). What the bench measures instead, side by side in one run on 4 ranks
(gloo, CPU, the reference engine): a MoE GPT with its experts replicated (ep 1, DDP) vs
sharded over 2 and 4 ranks (all-to-all dispatch / combine), and a long-sequence GPT with
4 data replicas (cp 1) vs rings of 2 and 4 ranks. Per layout: mean step time (steps after
the first), the ratio to the ep 1 / cp 1 layout, bytes per rank per step on the ep / cp
axis (traced), and the busiest rank's peak activations and model state (what EP and CP are
for: experts / ep per rank, activations / cp). A markdown table for docs/benchmarks.md.
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

from devtools.launch import read_trace, torchrun  # noqa: E402
from jobs.spec import parse_spec  # noqa: E402

MOE = {"arch": "gpt", "layers": 4, "hidden": 64, "heads": 4, "seq_len": 32, "vocab": 256,
       "experts": 8, "top_k": 2, "aux_loss_coef": 0.01}
LONG = {"arch": "gpt", "layers": 4, "hidden": 64, "heads": 4, "seq_len": 512, "vocab": 256}
LAYOUTS = [("moe ep1", MOE, {"ep": 1}, "ep"), ("moe ep2", MOE, {"ep": 2}, "ep"),
           ("moe ep4", MOE, {"ep": 4}, "ep"), ("long cp1", LONG, {"cp": 1}, "cp"),
           ("long cp2", LONG, {"cp": 2}, "cp"), ("long cp4", LONG, {"cp": 4}, "cp")]


def run(model: dict, par: dict, steps: int, out: Path) -> dict:
    spec = parse_spec({"model": model, "parallel": {"dp": 4, "dp_mode": "allreduce", **par},
                       "train": {"steps": steps, "global_batch": 8},
                       "runtime": {"nproc_per_node": 4}}, require_available=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "spec.json").write_text(json.dumps(spec.to_dict()))
    p = torchrun(4, ["-m", "jobs.train", "--spec", str(out / "spec.json"), "--out", str(out)],
                 timeout=900)
    if p.returncode:
        raise SystemExit(f"{out.name} failed:\n{p.stderr[-3000:]}")
    return json.loads((out / "summary.json").read_text())


def axis_bytes(out: Path, axis: str, steps: int) -> float:
    """Bytes the busiest rank sends per step on `axis` (its traced comm records)."""
    per_rank = [sum(x.get("bytes_sent", 0) for x in read_trace(out, r)
                    if x["type"] == "comm" and x.get("axis") == axis and x["step"] >= 0)
                for r in range(4)]
    return max(per_rank) / steps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--out", type=Path, default=Path("/tmp/ep-cp-bench"))
    args = ap.parse_args()
    rows, base = [], {}
    for name, model, par, axis in LAYOUTS:
        d = args.out / name.replace(" ", "-")
        s = run(model, par, args.steps, d)
        t = s["mean_step_time_s"]
        base.setdefault(axis, t)
        mem = [r["memory"]["peak_bytes"] for r in s["ranks"]]
        rows.append((name, t, t / base[axis], axis_bytes(d, axis, args.steps),
                     max(m.get("activations", 0) for m in mem),
                     max(m.get("params", 0) + m.get("grads", 0) + m.get("optimizer", 0)
                         for m in mem)))
        print(f"{name}: {t * 1e3:.1f} ms/step", flush=True)
    print(f"\n{time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs, gloo, 4 ranks, dp 4 "
          f"(all-reduce), global batch 8, {args.steps} steps (mean of steps 1..); MoE GPT "
          f"{MOE}; long GPT {LONG}\n")
    print("| layout | ms/step | vs ep1 / cp1 | ep / cp bytes per rank per step | peak "
          "activations (B) | model state (B) |")
    print("|---|---|---|---|---|---|")
    for name, t, q, b, act, state in rows:
        print(f"| {name} | {t * 1e3:.1f} | {q:.2f} | {b:,.0f} | {act:,.0f} | {state:,.0f} |")


if __name__ == "__main__":
    main()
