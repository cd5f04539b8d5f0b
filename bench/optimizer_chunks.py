"""The reference engines' Adam over a flat CPU buffer, whole and in cache-sized chunks, beside
torch.optim.Adam over the same elements as separate parameters (what the native engines step).

    OMP_NUM_THREADS=1 python bench/optimizer_chunks.py [--elems 526336] [--reps 200] [--rounds 5]

The arms alternate round by round; each prints the median of its rounds' mean step time. The
default size is the reference DDP's buffer in bench/dp_ref_vs_native.py (mlp h=256 x 8: eight
256 x 256 weights and their biases, 2.1 MB in fp32). "whole" is EagerOptimizer with the chunk
size raised above the buffer, i.e. the update before chunking.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from jobs.parallel import optim  # noqa: E402


def _timed(step, reps: int) -> float:
    step()
    t0 = time.perf_counter()
    for _ in range(reps):
        step()
    return (time.perf_counter() - t0) / reps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--elems", type=int, default=8 * (256 * 256 + 256))
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    torch.manual_seed(0)
    flat = torch.nn.Parameter(torch.randn(args.elems))
    flat.grad = torch.randn(args.elems)
    ours = optim.EagerOptimizer([flat], "adam", 1e-3)
    layer = 256 * 256 + 256
    sizes = [layer] * (args.elems // layer) + ([args.elems % layer] if args.elems % layer else [])
    params = [torch.nn.Parameter(t.clone()) for t in flat.detach().split(sizes)]
    for p in params:
        p.grad = torch.randn_like(p)
    theirs = torch.optim.Adam(params, lr=1e-3)
    chunk = optim.CPU_CHUNK_BYTES

    def whole():
        optim.CPU_CHUNK_BYTES = 1 << 62
        try:
            ours.step()
        finally:
            optim.CPU_CHUNK_BYTES = chunk

    arms = {"EagerOptimizer, whole buffer": whole,
            f"EagerOptimizer, {chunk >> 10} KiB chunks": ours.step,
            f"torch.optim.Adam, {len(params)} parameters": theirs.step}
    times: dict[str, list[float]] = {k: [] for k in arms}
    for _ in range(args.rounds):
        for name, step in arms.items():
            times[name].append(_timed(step, args.reps))
    print(f"Adam on {args.elems:,} fp32 elements, torch {torch.__version__}, "
          f"{torch.get_num_threads()} thread(s), median of {args.rounds} rounds x {args.reps} "
          "steps\n")
    print("| arm | ms per step |")
    print("|---|---|")
    for name, ts in times.items():
        print(f"| {name} | {statistics.median(ts) * 1e3:.2f} |")


if __name__ == "__main__":
    main()
