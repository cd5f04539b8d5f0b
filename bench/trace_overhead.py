"""Tracing overhead on step time (goal: <= 3 % at the default schedule, <= 0.5 % with
`level: off`).

    python bench/trace_overhead.py [--nproc 2] [--steps 30] [--trials 5] [--trace JSON]

Launches itself under torchrun (gloo). On each rank the same reference DDP model is trained
alternately by the job's loop `jobs.loop.train_loop` (a) with the real Tracer (spans, one comm
record per bucket, memory records, flushing) and (b) with the tracer off (NullTracer; the loop's
own memory accounting still runs). Trials alternate a/b to share the machine's noise; the
median step time of each is reported with the ratio, and a load-independent estimate: the cost
of the records one step writes, each timed alone, over the untraced step time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from devtools.launch import torchrun  # noqa: E402

SPEC = {"model": {"arch": "mlp", "hidden": 256, "layers": 8},
        "parallel": {"dp": 2, "dp_mode": "ddp", "bucket_mb": 0.25},
        "train": {"global_batch": 64}, "runtime": {"nproc_per_node": 2}}


def worker(args) -> None:
    import torch
    import torch.distributed as dist

    from jobs.compose import Composed
    from jobs.context import RunContext
    from jobs.dims import ParallelDims
    from jobs.loop import train_loop
    from jobs.models import mlp
    from jobs.parallel.data import DDP
    from jobs.runners import DirectRunner
    from jobs.spec import parse_spec
    from jobs.trace import NullTracer, Tracer

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    data = json.loads(json.dumps(SPEC))
    data["parallel"]["dp"] = data["runtime"]["nproc_per_node"] = world
    data["train"]["steps"] = args.steps
    data["trace"] = json.loads(args.trace)  # default: every step, the cost of a traced step
    spec = parse_spec(data, max_world_size=1 << 30)
    dims = ParallelDims.from_spec(spec, world)
    mesh = dims.build_mesh("cpu")
    group = mesh["dp"].get_group()
    out = Path(args.out)

    cpu: dict[str, list[float]] = {}  # process CPU seconds per step (all threads)

    def traced() -> list[float]:
        tr = Tracer(out / f"t{rank}", rank, world, meta={"backend": "gloo"})
        ctx = RunContext(spec, out, rank, world, "gloo", torch.device("cpu"), dims, mesh, tr)
        s = DDP(mlp.build(spec.model, 0), group, tr, lr=1e-3, bucket_mb=0.25)
        c0, m0 = time.process_time(), time.thread_time()
        res = train_loop(ctx, Composed(s, DirectRunner(s, mlp.loss_fn, tr, 1)))
        cpu.setdefault("a", []).append((time.process_time() - c0) / args.steps)
        cpu.setdefault("ma", []).append((time.thread_time() - m0) / args.steps)
        tr.close()
        return res["step_times"][2:]

    def bare() -> list[float]:
        tr = NullTracer()  # the same loop, memory accounting included, tracer off
        ctx = RunContext(spec, out, rank, world, "gloo", torch.device("cpu"), dims, mesh, tr)
        s = DDP(mlp.build(spec.model, 0), group, tr, lr=1e-3, bucket_mb=0.25)
        c0, m0 = time.process_time(), time.thread_time()
        res = train_loop(ctx, Composed(s, DirectRunner(s, mlp.loss_fn, tr, 1)))
        cpu.setdefault("b", []).append((time.process_time() - c0) / args.steps)
        cpu.setdefault("mb", []).append((time.thread_time() - m0) / args.steps)
        return res["step_times"][2:]

    a, b = [], []
    for trial in range(args.trials):  # alternate the order too
        for fn in ((traced, bare) if trial % 2 == 0 else (bare, traced)):
            dist.barrier()
            (a if fn is traced else b).extend(fn())
    if rank == 0:
        ta, tb = statistics.median(a), statistics.median(b)
        est = estimate(out / f"t{rank}" / f"trace-rank{rank}.jsonl", Tracer)
        print(json.dumps({"traced_median_s": ta, "bare_median_s": tb,
                          "overhead": ta / tb - 1, "steps": len(a), "world": world,
                          "tracer_s_per_step": est, "estimated_overhead": est / tb,
                          "cpu_traced_s": statistics.median(cpu["a"]),
                          "cpu_bare_s": statistics.median(cpu["b"]),
                          "main_traced_s": statistics.median(cpu["ma"]),
                          "main_bare_s": statistics.median(cpu["mb"])}))
    dist.destroy_process_group()


def estimate(trace: Path, Tracer) -> float:
    """Load-independent view: the cost of the records one step writes, each timed alone
    (best of 5 x 2000), plus the saved-tensor hook calls, summed."""
    import torch

    from jobs.memory import SavedTensorCounter
    recs = [json.loads(ln) for ln in trace.read_text().splitlines()]
    step = max(r["step"] for r in recs) - 1
    kinds = {}
    for r in recs:
        if r["step"] == step:
            kinds[r["type"]] = kinds.get(r["type"], 0) + 1
    d = Path(tempfile.mkdtemp())
    tr = Tracer(d, 0, 1, cuda_events=False, sync_clock=False)

    def best(fn) -> float:
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(2000):
                fn()
            times.append((time.perf_counter() - t0) / 2000)
        return min(times)

    def comm():
        tr.comm_start("all_reduce", payload_bytes=1 << 18, group_size=2, axis="dp",
                      group="dp", bucket=1).done()

    def span():
        with tr.span("forward"):
            pass

    def mem():
        tr.memory(phase="after_step", params=1, grads=2, optimizer=3)

    t = torch.zeros(4)
    c = SavedTensorCounter()
    cost = {"comm": best(comm), "span": best(span), "mem": best(mem)}
    t_write = best(lambda: json.dumps({"type": "span", "name": "forward", "ts_ns": 1,
                                       "dur_ns": 2, "rank": 0, "step": 3}))
    hooks = 24 * best(lambda: (c.reset(), c.count(t)))  # ~24 saved tensors per step here
    tr.close()
    return (sum(cost.get(k, 0) * v for k, v in kinds.items())
            + sum(kinds.values()) * t_write + hooks)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--out", default="")
    ap.add_argument("--trace", default='{"steps": "all"}',
                    help="the traced arm's spec `trace` section as JSON: '{\"steps\": \"all\"}' "
                    "(every step, the default here), '{}' (the default schedule), "
                    "'{\"level\": \"off\"}'")
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    with tempfile.TemporaryDirectory() as d:
        p = torchrun(args.nproc, [__file__, "--worker", "--out", d, "--steps", str(args.steps),
                                  "--trials", str(args.trials), "--trace", args.trace],
                     timeout=3600)
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
        if p.returncode or not lines:
            sys.exit(p.stderr[-3000:])
        r = json.loads(lines[-1])
        print(f"tracing overhead, trace {args.trace} (reference DDP, mlp h=256 L=8, gb=64, "
              f"N={r['world']}, "
              f"{r['steps']} steps each): traced {r['traced_median_s'] * 1e3:.2f} ms, "
              f"bare {r['bare_median_s'] * 1e3:.2f} ms, overhead {r['overhead'] * 100:+.1f}%"
              f" measured; tracer work per step {r['tracer_s_per_step'] * 1e6:.0f} us = "
              f"{r['estimated_overhead'] * 100:.1f}% of the bare step (estimate); process CPU "
              f"per step {r['cpu_traced_s'] * 1e3:.2f} vs {r['cpu_bare_s'] * 1e3:.2f} ms = "
              f"{(r['cpu_traced_s'] / r['cpu_bare_s'] - 1) * 100:+.1f}%; training-thread CPU "
              f"per step {r['main_traced_s'] * 1e3:.2f} vs {r['main_bare_s'] * 1e3:.2f} ms = "
              f"{(r['main_traced_s'] / r['main_bare_s'] - 1) * 100:+.1f}%")


if __name__ == "__main__":
    main()
