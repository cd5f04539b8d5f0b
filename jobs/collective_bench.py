"""Entry point of a collective bandwidth sweep (job kind `collective_bench`), run by torchrun:

    torchrun --nproc-per-node N -m jobs.collective_bench --spec SPEC.json --out DIR

For every op of `collective.ops` (and, for all_reduce, every algorithm of
`collective.algorithms`) and every size of the sweep min_bytes, min_bytes*factor, ... max_bytes:
one traced iteration, `warmup` untimed and `iters` timed iterations, each after a barrier and
from fresh inputs, each result checked when `collective.check` is on. The world size is
`runtime.nproc_per_node` (the parallel degrees are ignored for this kind).

Writes `DIR/trace-rank{R}.jsonl` (jobs.trace; the traced iteration of each point is trace step
= point index, announced by an instant `bench_point`), `DIR/summary.json` (rank 0, shape in
docs/collectives.md) and `DIR/error-rank{R}.txt` with the traceback when a rank fails. Rank 0
prints an nccl-tests-like table as it goes.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
import torch.distributed as dist

from jobs.comm import sweep
from jobs.dist_init import init_bench_group
from jobs.entry import exit_now, host_meta, job_main
from jobs.spec import JobSpec
from jobs.trace import Tracer

COPY_MIN_BYTES, COPY_MAX_BYTES = 32 << 20, 256 << 20

HEADER = (f"{'size(B)':>12} {'count':>10} {'type':>8} {'op':>14} {'algorithm':>10} "
          f"{'min(us)':>10} {'mean(us)':>10} {'max(us)':>10} {'algbw(GB/s)':>11} "
          f"{'busbw(GB/s)':>11} {'%copy':>6} {'ok':>4}")


def format_row(r: dict) -> str:
    frac = "" if r.get("busbw_frac_of_copy") is None else f"{100 * r['busbw_frac_of_copy']:.1f}"
    ok = {True: "ok", False: "FAIL", None: "-"}[r["correct"]]
    return (f"{r['bytes']:>12} {r['count']:>10} {r['dtype']:>8} {r['op']:>14} "
            f"{r['algorithm']:>10} {r['time_us_min']:>10.1f} {r['time_us_mean']:>10.1f} "
            f"{r['time_us_max']:>10.1f} {r['algbw_GBps']:>11.3f} {r['busbw_GBps']:>11.3f} "
            f"{frac:>6} {ok:>4}")


def points(spec: JobSpec) -> list[tuple[str, str, int]]:
    """(op, algorithm, requested bytes) in run order. Algorithms other than `builtin` are
    all-reduce algorithms: they run under op all_reduce only."""
    c = spec.collective
    sizes = sweep.sweep_sizes(c.min_bytes, c.max_bytes, c.factor)
    out = []
    for op in c.ops:
        for algo in (c.algorithms if op == "all_reduce" else ("builtin",)):
            out += [(op, algo, s) for s in sizes]
    return out


def _gather_times(times: list[float], ctrl) -> list[float]:
    t = torch.tensor(times, dtype=torch.float64)
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size(ctrl))]
    dist.all_gather(parts, t, group=ctrl)
    return torch.cat(parts).tolist()


def _all_true(flag: bool | None, ctrl) -> bool | None:
    if flag is None:
        return None
    t = torch.tensor([1 if flag else 0], dtype=torch.int32)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=ctrl)
    return bool(t.item())


def _provenance(backend: str) -> dict:
    """What the worker adds to the run's provenance: the job's own view of its runtime."""
    info = {"torch_threads": torch.get_num_threads()}
    if backend == "nccl":
        info["nccl_version"] = ".".join(map(str, torch.cuda.nccl.version()))
    return info


def run(spec: JobSpec, out: Path) -> dict | None:
    backend, rank, world, device, ctrl = init_bench_group(spec.runtime.backend)
    c = spec.collective
    dtype = sweep.DTYPES[c.dtype]
    t_start = time.perf_counter()
    tracer = Tracer(out, rank, world, meta={"backend": backend, "kind": spec.kind,
                                            "spec": spec.to_dict(), **host_meta()})

    copy_bytes = min(max(c.max_bytes, COPY_MIN_BYTES), COPY_MAX_BYTES)
    host_bw = d2d_bw = None
    if rank == 0:
        host_bw = sweep.copy_bandwidth(copy_bytes, "cpu")
        if device.type == "cuda":
            d2d_bw = sweep.copy_bandwidth(copy_bytes, device)
        print(f"# collective_bench: world {world}, backend {backend}, dtype {c.dtype}, "
              f"warmup {c.warmup}, iters {c.iters}, check {c.check}", flush=True)
        print(f"# local copy bandwidth: host {host_bw / 1e9:.2f} GB/s"
              + (f", device-to-device {d2d_bw / 1e9:.2f} GB/s" if d2d_bw else "")
              + f" ({copy_bytes} B)", flush=True)
        print("#" + HEADER[1:], flush=True)
    ceiling = d2d_bw or host_bw
    results = []
    for idx, (op, algo, nbytes) in enumerate(points(spec)):
        case = sweep.make_case(op, algo, nbytes, dtype, device, ps_placement=c.ps_placement)
        tracer.step = idx
        tracer.instant("bench_point", op=op, algorithm=algo, payload_bytes=case.nbytes,
                       count=case.count, group_size=case.n,
                       ps_placement=c.ps_placement if algo == "ps" else None)
        times, ok = sweep.time_case(case, warmup=c.warmup, iters=c.iters, check=c.check,
                                    device=device, ctrl=ctrl, tracer=tracer)
        with tracer.span("bench_timed", cat="bench", device=False, op=op, algorithm=algo,
                         payload_bytes=case.nbytes, times_us=[t * 1e6 for t in times]):
            pass
        all_times = _gather_times(times, ctrl)
        ok = _all_true(ok, ctrl)
        row = {"op": op, "algorithm": algo,
               "ps_placement": c.ps_placement if algo == "ps" else None,
               "bytes": case.nbytes, "count": case.count, "dtype": c.dtype, "n": case.n,
               **sweep.summarize(case.op, case.nbytes, case.n, all_times, ceiling),
               "correct": ok}
        results.append(row)
        if rank == 0:
            print(" " + format_row(row)[1:], flush=True)
        del case
    tracer.close()
    summary = None
    if rank == 0:
        wrong = sum(1 for r in results if r["correct"] is False)
        summary = {"kind": "collective_bench", "strategy": spec.strategy, "world_size": world,
                   "backend": backend, "device": device.type, "dtype": c.dtype,
                   "copy_bandwidth_GBps": host_bw / 1e9,
                   "d2d_copy_bandwidth_GBps": d2d_bw / 1e9 if d2d_bw else None,
                   "copy_bytes": copy_bytes, "ops": list(c.ops),
                   "algorithms": list(c.algorithms), "ps_placement": c.ps_placement,
                   "sizes": sweep.sweep_sizes(c.min_bytes, c.max_bytes, c.factor),
                   "warmup": c.warmup, "iters": c.iters, "check": c.check,
                   "wrong": wrong, "all_correct": None if not c.check else wrong == 0,
                   "wall_s": time.perf_counter() - t_start,
                   "provenance": _provenance(backend), "results": results}
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
        print(f"# {len(results)} points, {wrong} wrong, "
              f"{summary['wall_s']:.1f} s", flush=True)
    dist.barrier(group=ctrl)
    dist.destroy_process_group()
    if summary is not None and summary["wrong"]:
        raise RuntimeError(f"{summary['wrong']} of {len(results)} points gave a wrong result "
                           "(see summary.json)")
    return summary


def main(argv: list[str] | None = None) -> int:
    return job_main("python -m jobs.collective_bench", "collective_bench", run, argv)


if __name__ == "__main__":
    exit_now(main())
