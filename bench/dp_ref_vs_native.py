"""Step time of each reference data-parallel strategy against its native twin (goal <= 1.15).

    python bench/dp_ref_vs_native.py [--nproc 2] [--steps 12] [--trials 3] [--hidden 256]

Launches itself under torchrun (gloo). For each pair (DDP / DistributedDataParallel, ZeRO-1 /
ZeroRedundancyOptimizer, ZeRO-2 / FSDP2 reshard_after_forward=False, ZeRO-3 / FSDP2 True), the
same spec (mlp, fp32, same seed and batches) runs through the job's loop with the tracer on,
trials alternating reference / native; the median steady-state step time (steps >= 2, the
slowest rank per step) of each and their ratio are printed as a markdown table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from devtools.launch import torchrun  # noqa: E402

PAIRS = {"ddp": {"dp_mode": "ddp"}, "zero1": {"zero_stage": 1}, "zero2": {"zero_stage": 2},
         "zero3": {"zero_stage": 3}}


def worker(args) -> None:
    import torch
    import torch.distributed as dist

    from jobs.compose import Composed, build_strategy
    from jobs.context import RunContext
    from jobs.dims import ParallelDims
    from jobs.loop import train_loop
    from jobs.models import mlp
    from jobs.runners import DirectRunner
    from jobs.spec import parse_spec
    from jobs.trace import Tracer

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    out = Path(args.out)
    dims = mesh = None
    times: dict[str, list[float]] = {}
    for trial in range(args.trials):
        for name, par in PAIRS.items():
            for engine in ("reference", "native"):
                spec = parse_spec({
                    "model": {"arch": "mlp", "hidden": args.hidden, "layers": 8},
                    "parallel": {"dp": world, "engine": engine, "bucket_mb": 1.0, **par},
                    "train": {"steps": args.steps, "global_batch": 64},
                    "runtime": {"nproc_per_node": world}}, max_world_size=1 << 30)
                if dims is None:
                    dims = ParallelDims.from_spec(spec, world)
                    mesh = dims.build_mesh("cpu")
                d = out / f"{name}-{engine}-{trial}"
                tr = Tracer(d, rank, world, meta={"backend": "gloo"})
                ctx = RunContext(spec, d, rank, world, "gloo", torch.device("cpu"), dims, mesh,
                                 tr)
                s = build_strategy(ctx, mlp.build(spec.model, 0))
                dist.barrier()
                res = train_loop(ctx, Composed(s, DirectRunner(s, mlp.loss_fn, tr, 1)))
                tr.close()
                t = torch.tensor(res["step_times"][2:])
                dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank sets the step
                times.setdefault(f"{name}/{engine}", []).extend(t.tolist())
    if rank == 0:
        print(json.dumps({k: statistics.median(v) for k, v in times.items()}))
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    with tempfile.TemporaryDirectory() as d:
        p = torchrun(args.nproc, [__file__, "--worker", "--out", d, "--steps", str(args.steps),
                                  "--trials", str(args.trials), "--hidden", str(args.hidden)],
                     timeout=3600)
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
        if p.returncode or not lines:
            sys.exit(p.stderr[-3000:])
        med = json.loads(lines[-1])
    print(f"mlp h={args.hidden} L=8, global batch 64, fp32, gloo, N={args.nproc}, median of "
          f"{args.trials} x {args.steps - 2} steady steps (slowest rank)\n")
    print("| strategy | reference ms | native ms | native component | ratio ref/native |")
    print("|---|---|---|---|---|")
    native = {"ddp": "DistributedDataParallel", "zero1": "ZeroRedundancyOptimizer",
              "zero2": "FSDP2 reshard=False", "zero3": "FSDP2 reshard=True"}
    for name in PAIRS:
        r, n = med[f"{name}/reference"], med[f"{name}/native"]
        print(f"| {name} | {r * 1e3:.2f} | {n * 1e3:.2f} | {native[name]} | {r / n:.2f} |")


if __name__ == "__main__":
    main()
