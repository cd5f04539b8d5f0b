"""Tracing overhead on step time (goal: <= 3 % at the default schedule, <= 0.5 % with
`level: off`).

    python bench/trace_overhead.py [--nproc 2] [--steps 30] [--trials 5] [--trace JSON]

Launches itself under torchrun (gloo). On each rank the same reference DDP model is trained
alternately by the job's loop `jobs.loop.train_loop` (a) with the real Tracer (spans, one comm
record per bucket, memory records, flushing) and (b) with the tracer off (NullTracer; the loop's
own memory accounting still runs). Trials alternate a/b to share the machine's noise; the
median step time of each is reported with the ratio (load-dependent: on a busy 2-core box the
ranks amplify small delays), and the load-independent figure the goal is stated in, the
tracer's own share of the process CPU:

    (tracer calls of one step, each timed alone in thread CPU time at the arm's level and
     schedule, + the flusher thread's CPU time per step, read from its own CPU clock in the
     run) / the bare arm's process CPU per step

The calls per step are counted from a short calibration run traced in full (every call writes
a record there); the tracer's construction and close, once per run, are reported apart.
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

    def run(tr, sp) -> dict:
        ctx = RunContext(sp, out, rank, world, "gloo", torch.device("cpu"), dims, mesh, tr)
        s = DDP(mlp.build(sp.model, 0), group, tr, lr=1e-3, bucket_mb=0.25)
        return train_loop(ctx, Composed(s, DirectRunner(s, mlp.loss_fn, tr, 1)))

    def traced() -> list[float]:
        i0 = time.thread_time()
        tr = Tracer(out / f"t{rank}", rank, world, meta={"backend": "gloo"})
        cpu.setdefault("init", []).append(time.thread_time() - i0)
        flusher = time.pthread_getcpuclockid(tr._thread.ident)
        f0 = time.clock_gettime(flusher)
        c0, m0 = time.process_time(), time.thread_time()
        res = run(tr, spec)
        cpu.setdefault("a", []).append((time.process_time() - c0) / args.steps)
        cpu.setdefault("ma", []).append((time.thread_time() - m0) / args.steps)
        cpu.setdefault("flusher", []).append((time.clock_gettime(flusher) - f0) / args.steps)
        k0 = time.process_time()  # the flusher's last turn and the final writes
        tr.close()
        cpu.setdefault("close", []).append(time.process_time() - k0)
        return res["step_times"][2:]

    def bare() -> list[float]:
        tr = NullTracer()  # the same loop, memory accounting included, tracer off
        c0, m0 = time.process_time(), time.thread_time()
        res = run(tr, spec)
        cpu.setdefault("b", []).append((time.process_time() - c0) / args.steps)
        cpu.setdefault("mb", []).append((time.thread_time() - m0) / args.steps)
        return res["step_times"][2:]

    # calibration: a few steps traced in full, where every tracer call writes a record
    full = json.loads(json.dumps(data))
    full["trace"], full["train"]["steps"] = {"steps": "all"}, 4
    cal = Tracer(out / f"cal{rank}", rank, world, meta={"backend": "gloo"})
    run(cal, parse_spec(full, max_world_size=1 << 30))
    cal.close()
    dist.barrier()

    a, b = [], []
    for trial in range(args.trials):  # alternate the order too
        for fn in ((traced, bare) if trial % 2 == 0 else (bare, traced)):
            dist.barrier()
            (a if fn is traced else b).extend(fn())
    if rank == 0:
        ta, tb = statistics.median(a), statistics.median(b)
        calls = calls_per_step(out / f"cal{rank}" / f"trace-rank{rank}.jsonl")
        main = tracer_calls_s(calls, spec.trace, args.steps, Tracer)
        flush = statistics.median(cpu["flusher"])
        bare = statistics.median(cpu["b"])
        print(json.dumps({"traced_median_s": ta, "bare_median_s": tb,
                          "overhead": ta / tb - 1, "steps": len(a), "world": world,
                          "calls_per_step": calls, "tracer_calls_s": main,
                          "flusher_s": flush, "tracer_share": (main + flush) / bare,
                          "init_s": statistics.median(cpu["init"]),
                          "close_s": statistics.median(cpu["close"]),
                          "cpu_traced_s": statistics.median(cpu["a"]), "cpu_bare_s": bare,
                          "main_traced_s": statistics.median(cpu["ma"]),
                          "main_bare_s": statistics.median(cpu["mb"])}))
    dist.destroy_process_group()


def calls_per_step(trace: Path) -> dict[str, int]:
    """The tracer calls one step makes, from a step of the calibration run (traced in full:
    one record per span, collective and memory sample)."""
    recs = [json.loads(ln) for ln in trace.read_text().splitlines()]
    step = max(r["step"] for r in recs) - 1
    kinds = {"begin_step": 1, "scalars": 1}
    for r in recs:
        if r["step"] == step and r["type"] in ("span", "comm", "mem"):
            kinds[r["type"]] = kinds.get(r["type"], 0) + 1
    return kinds


def tracer_calls_s(calls: dict[str, int], trace_spec, steps: int, Tracer) -> float:
    """Thread CPU seconds of one step's tracer calls, each timed alone (best of 5 x 2000) from
    a stack as deep as the loop's, on a tracer configured like the arm's: traced steps' costs
    and untraced steps' weighted by the share of the arm's steps its schedule traces."""
    from jobs.trace_schedule import is_scheduled

    d = Path(tempfile.mkdtemp())
    tr = Tracer(d, 0, 1, cuda_events=False, sync_clock=False, meta={"backend": "gloo"})
    tr.configure(trace_spec)
    tr.step = 5

    def best(fn) -> float:
        times = []
        for _ in range(5):
            t0 = time.thread_time_ns()
            for _ in range(2000):
                fn()
            times.append((time.thread_time_ns() - t0) / 2000 / 1e9)
        return min(times)

    def deep(fn, k=12):  # the loop's collectives are issued ~12 frames down
        return best(fn) if k == 0 else deep(fn, k - 1)

    def comm():  # DDP's bucket all-reduce (jobs/parallel/base.py: async, done by its future)
        tr.comm_start("all_reduce", payload_bytes=1 << 18, group_size=2, axis="dp",
                      group="dp", device=False, bucket=1, dtype="float32",
                      **{"async": True}).done()

    def span():
        with tr.span("forward.layer", layer=1):
            pass

    def mem():
        tr.memory(phase="after_step", params=1, grads=2, optimizer=3)

    def begin():
        tr.begin_step(tr.step)

    def scalars():
        tr.scalars(step_s=0.01, tokens=64, tokens_per_s=6400.0, loss=1.0, loss_weight=1.0)

    fns = {"comm": comm, "span": span, "mem": mem, "scalars": scalars}
    share = sum(is_scheduled(trace_spec, s) for s in range(steps)) / steps
    begin_cost = deep(begin)  # sets `enabled` by the schedule: set again below
    total = 0.0
    for on, weight in ((True, share), (False, 1 - share)):
        if weight:
            tr.enabled = on
            costs = {k: deep(fn) for k, fn in fns.items()}
            costs["begin_step"] = begin_cost
            total += weight * sum(costs.get(k, 0.0) * n for k, n in calls.items())
    tr.close()
    return total


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
              f"N={r['world']}, {r['steps']} steps each): traced {r['traced_median_s'] * 1e3:.2f}"
              f" ms, bare {r['bare_median_s'] * 1e3:.2f} ms, overhead "
              f"{r['overhead'] * 100:+.1f}% measured; process CPU per step "
              f"{r['cpu_traced_s'] * 1e3:.2f} vs {r['cpu_bare_s'] * 1e3:.2f} ms = "
              f"{(r['cpu_traced_s'] / r['cpu_bare_s'] - 1) * 100:+.1f}%; training-thread CPU "
              f"per step {r['main_traced_s'] * 1e3:.2f} vs {r['main_bare_s'] * 1e3:.2f} ms = "
              f"{(r['main_traced_s'] / r['main_bare_s'] - 1) * 100:+.1f}%")
        print(f"tracer's own share of process CPU (load-independent): calls per step "
              f"{r['calls_per_step']} = {r['tracer_calls_s'] * 1e6:.0f} us + flusher thread "
              f"{r['flusher_s'] * 1e6:.0f} us per step, over the bare arm's "
              f"{r['cpu_bare_s'] * 1e3:.2f} ms = {r['tracer_share'] * 100:.2f}%; once per run: "
              f"construction {r['init_s'] * 1e3:.1f} ms, close {r['close_s'] * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
