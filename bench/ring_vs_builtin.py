"""Ring all-reduce written with isend/irecv (jobs/comm/allreduce.py) against the backend's own.

    OMP_NUM_THREADS=1 .venv/bin/python bench/ring_vs_builtin.py [--bytes 16777216] [--ranks 2]
        [--iters 40] [--warmup 3] [--algorithms ring]

Launches torchrun on gloo. Every iteration times the built-in all_reduce and then each
algorithm back to back, with the buffers of the collective_bench job (jobs.comm.sweep: fresh
inputs and a barrier before every call, every result checked), so load from other processes on
the host hits all of them alike. Prints busbw from the median, mean and best per-iteration time
(averaged over ranks), each as a ratio to the built-in's, and the built-in's busbw as a fraction
of the host's local copy bandwidth.
Acceptance (issue 6): ring >= 0.70 of built-in at 16 MB on 2 ranks.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from devtools.launch import torchrun  # noqa: E402


def worker(args) -> None:
    import time

    import torch
    import torch.distributed as dist

    sys.path.insert(0, str(ROOT))
    from jobs.comm import sweep

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    algos = ["builtin", *args.algorithms]
    cases = {a: sweep.make_case("all_reduce", a, args.bytes, torch.float32, "cpu")
             for a in algos}
    times: dict[str, list[float]] = {a: [] for a in algos}
    ok = True
    for it in range(args.warmup + args.iters):
        for a in algos:  # interleaved: each iteration times every algorithm back to back
            case = cases[a]
            case.reset()
            dist.barrier()
            t0 = time.perf_counter()
            case.run(None)
            dt = time.perf_counter() - t0
            ok = case.check() and ok
            if it >= args.warmup:
                times[a].append(dt)
    # mean over ranks of each iteration's time (the sweep's convention, per iteration)
    t = torch.tensor([times[a] for a in algos], dtype=torch.float64)
    dist.all_reduce(t)
    flag = torch.tensor([int(ok)])
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    copy = sweep.copy_bandwidth(max(args.bytes, 32 << 20), "cpu") if rank == 0 else None
    if rank == 0:
        per_iter = (t / world).tolist()
        Path(args.result).write_text(json.dumps({
            "times_s": dict(zip(algos, per_iter, strict=True)),
            "n": {a: cases[a].n for a in algos}, "S": cases["builtin"].nbytes,
            "copy_GBps": copy / 1e9, "correct": bool(flag.item())}))
    dist.destroy_process_group()



def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bytes", type=int, default=16 << 20)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--iters", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--algorithms", nargs="+", default=["ring"])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        p = torchrun(args.ranks, [__file__, "--worker", "--result", str(result), "--bytes",
                                  str(args.bytes), "--warmup", str(args.warmup), "--iters",
                                  str(args.iters), "--algorithms", *args.algorithms])
        if p.returncode:
            sys.exit(p.stderr[-3000:])
        res = json.loads(result.read_text())
    sys.path.insert(0, str(ROOT))
    from jobs import commbytes

    def gbps(a: str, t: float) -> float:
        return commbytes.busbw("all_reduce", res["S"], t, res["n"][a]) / 1e9

    ts = res["times_s"]
    med = {a: gbps(a, statistics.median(v)) for a, v in ts.items()}
    best = {a: gbps(a, min(v)) for a, v in ts.items()}
    mean = {a: gbps(a, statistics.fmean(v)) for a, v in ts.items()}
    load = os.getloadavg()[0]
    print(f"all_reduce {res['S']} B float32, {args.ranks} ranks, gloo, {args.iters} interleaved "
          f"iterations (+{args.warmup} warm-up), correct={res['correct']}, "
          f"load average {load:.1f} on {os.cpu_count()} CPUs")
    print(f"host local copy bandwidth {res['copy_GBps']:.2f} GB/s")
    print(f"{'algorithm':>10} {'busbw GB/s: median':>19} {'ratio':>6} {'mean':>7} {'ratio':>6} "
          f"{'best':>7} {'ratio':>6}")
    for a in ts:
        print(f"{a:>10} {med[a]:>19.3f} {med[a] / med['builtin']:>6.2f} {mean[a]:>7.3f} "
              f"{mean[a] / mean['builtin']:>6.2f} {best[a]:>7.3f} "
              f"{best[a] / best['builtin']:>6.2f}")
    print("(busbw from the median / mean / minimum over iterations of the per-iteration time "
          "averaged over ranks; ratio: to builtin)")
    print(f"builtin busbw / local copy bandwidth = {med['builtin'] / res['copy_GBps']:.3f} "
          f"(median), {best['builtin'] / res['copy_GBps']:.3f} (best)")
    return 0 if res["correct"] else 1


if __name__ == "__main__":
    sys.exit(main())
