"""Ring all-reduce written with isend/irecv (jobs/comm/allreduce.py) against the backend's own.

    OMP_NUM_THREADS=1 .venv/bin/python bench/ring_vs_builtin.py [--bytes 16777216] [--ranks 2]
        [--rounds 7] [--iters 5] [--algorithms ring]

Launches torchrun on gloo. Each round times `iters` iterations of the built-in all_reduce and
then of each algorithm, through the same code the collective_bench job uses (jobs.comm.sweep:
fresh inputs and a barrier before every iteration, every result checked); rounds alternate so
that load from other processes on the host hits both alike. Prints per-algorithm busbw (median
over rounds), its ratio to the built-in's, and the built-in's busbw as a fraction of the host's
local copy bandwidth. Acceptance (issue 6): ring >= 0.70 of built-in at 16 MB on 2 ranks.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def worker(args) -> None:
    import torch
    import torch.distributed as dist

    sys.path.insert(0, str(ROOT))
    from jobs.comm import sweep

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    algos = ["builtin", *args.algorithms]
    cases = {a: sweep.make_case("all_reduce", a, args.bytes, torch.float32, "cpu")
             for a in algos}
    busbw: dict[str, list[float]] = {a: [] for a in algos}
    ok = True
    for _ in range(args.rounds):
        for a in algos:
            times, good = sweep.time_case(cases[a], warmup=1, iters=args.iters, check=True,
                                          device="cpu")
            t = torch.tensor(times, dtype=torch.float64)
            parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
            dist.all_gather(parts, t)
            row = sweep.summarize("all_reduce", cases[a].nbytes, cases[a].n,
                                  torch.cat(parts).tolist())
            busbw[a].append(row["busbw_GBps"])
            ok = ok and bool(good)
    copy = sweep.copy_bandwidth(max(args.bytes, 32 << 20), "cpu") if rank == 0 else None
    if rank == 0:
        Path(args.result).write_text(json.dumps({"busbw_GBps": busbw, "copy_GBps": copy / 1e9,
                                                 "correct": ok}))
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bytes", type=int, default=16 << 20)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--algorithms", nargs="+", default=["ring"])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(args.ranks),
               "--master-addr", "127.0.0.1", "--master-port", str(free_port()), __file__,
               "--worker", "--result", str(result), "--bytes", str(args.bytes),
               "--rounds", str(args.rounds), "--iters", str(args.iters),
               "--algorithms", *args.algorithms]
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        subprocess.run(cmd, check=True, cwd=ROOT, env=env)
        res = json.loads(result.read_text())
    bw = {a: statistics.median(v) for a, v in res["busbw_GBps"].items()}
    best = {a: max(v) for a, v in res["busbw_GBps"].items()}
    print(f"all_reduce {args.bytes} B float32, {args.ranks} ranks, gloo, "
          f"{args.rounds} rounds x {args.iters} iters, correct={res['correct']}, "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"host local copy bandwidth {res['copy_GBps']:.2f} GB/s")
    print(f"{'algorithm':>10} {'busbw GB/s':>10} {'vs builtin':>10} {'best':>6} {'vs best':>8}"
          f"  per round")
    for a, v in res["busbw_GBps"].items():
        print(f"{a:>10} {bw[a]:>10.3f} {bw[a] / bw['builtin']:>10.2f} {best[a]:>6.3f} "
              f"{best[a] / best['builtin']:>8.2f}  " + " ".join(f"{x:.2f}" for x in v))
    print("(busbw: median over rounds of each round's busbw from the mean time over ranks and "
          "iterations; best: the best round)")
    print(f"builtin busbw / local copy bandwidth = {bw['builtin'] / res['copy_GBps']:.3f}")
    return 0 if res["correct"] else 1


if __name__ == "__main__":
    sys.exit(main())
