"""Entry point of a compute-rate calibration (job kind `compute_bench`), run by torchrun:

    torchrun --nproc-per-node N -m jobs.compute_bench --spec SPEC.json --out DIR

Every rank builds one layer of `model` (mlp: Linear(h, h) + ReLU; gpt: one transformer block,
jobs/models) in `compute.dtype` on its device and runs `compute.warmup` untimed and
`compute.iters` timed forward + backward passes over `compute.batch` samples (input and weight
gradients, a fixed upstream gradient: no loss, no optimizer). Each pass counts
jobs.theory.compute.layer_flops FLOPs (the per-layer term of training_flops, so the rate is the
one the advisor's compute term divides by); its rate is FLOPs / measured seconds. The world size
is `runtime.nproc_per_node` (the parallel degrees are ignored for this kind): every rank is a
device of the queue's hosts, timed on its own, so the spread across ranks shows uneven devices.

Writes `DIR/trace-rank{R}.jsonl` (jobs.trace: one span `calib_iter` per timed pass, trace step
= pass index, and one `calib_timed` span whose args hold this rank's times), `DIR/summary.json`
(rank 0, shape in docs/sweeps.md) and `DIR/error-rank{R}.txt` when a rank fails.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

from jobs.dist_init import init_bench_group
from jobs.entry import exit_now, host_meta, job_main
from jobs.models import gpt, mlp
from jobs.spec import JobSpec
from jobs.theory.compute import layer_flops
from jobs.trace import Tracer

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def make_layer(spec: JobSpec, device: torch.device, dtype: torch.dtype):
    """(layer, input, upstream gradient) of one layer of the spec's model shape."""
    m, c = spec.model, spec.compute
    torch.manual_seed(spec.train.seed)
    if m.arch == "gpt":
        layer = gpt.Block(m.hidden, m.heads)
        shape = (c.batch, m.seq_len, m.hidden)
    else:
        layer = mlp.Block(m.hidden)
        shape = (c.batch, m.hidden)
    layer = layer.to(device=device, dtype=dtype)
    x = torch.randn(shape, device=device, dtype=dtype, requires_grad=True)
    return layer, x, torch.randn(shape, device=device, dtype=dtype)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_layer(layer, x, grad, *, warmup: int, iters: int, device, tracer) -> list[float]:
    """Seconds of each timed forward + backward (after a device sync on both ends)."""
    def once():
        layer.zero_grad(set_to_none=True)
        x.grad = None
        layer(x).backward(grad)

    for _ in range(warmup):
        once()
    times = []
    for i in range(iters):
        tracer.step = i
        _sync(device)
        with tracer.span("calib_iter", cat="compute", device=False):
            t0 = time.perf_counter()
            once()
            _sync(device)
            times.append(time.perf_counter() - t0)
    return times


def rate_stats(rates: list[float]) -> dict:
    """Median, min, max, mean of FLOP/s figures and their spread (max - min) / median."""
    med = statistics.median(rates)
    return {"median": med, "min": min(rates), "max": max(rates),
            "mean": statistics.fmean(rates), "spread": (max(rates) - min(rates)) / med}


def summarize(times_by_rank: list[list[float]], flops: float) -> dict:
    """Per-rank rows (`results`) and the rate over every rank and pass (`flops_per_s`)."""
    results = []
    for rank, times in enumerate(times_by_rank):
        rates = [flops / t for t in times]
        results.append({"rank": rank, "times_s": times, "flops_per_s": rates,
                        **{f"{k}_flops_per_s": v for k, v in rate_stats(rates).items()
                           if k != "spread"}})
    every = [r for row in results for r in row["flops_per_s"]]
    medians = [row["median_flops_per_s"] for row in results]
    return {"flops_per_s": rate_stats(every),
            "rank_spread": (max(medians) - min(medians)) / statistics.median(medians),
            "results": results}


def _gather_times(times: list[float], ctrl) -> list[list[float]]:
    t = torch.tensor(times, dtype=torch.float64)
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size(ctrl))]
    dist.all_gather(parts, t, group=ctrl)
    return [p.tolist() for p in parts]


def run(spec: JobSpec, out: Path) -> dict | None:
    backend, rank, world, device, ctrl = init_bench_group(spec.runtime.backend)
    m, c = spec.model, spec.compute
    t_start = time.perf_counter()
    tracer = Tracer(out, rank, world, meta={"backend": backend, "kind": spec.kind,
                                            "spec": spec.to_dict(), **host_meta()})
    flops, formula = layer_flops(m, c.batch)
    layer, x, grad = make_layer(spec, device, DTYPES[c.dtype])
    times = time_layer(layer, x, grad, warmup=c.warmup, iters=c.iters, device=device,
                       tracer=tracer)
    with tracer.span("calib_timed", cat="bench", device=False, flops=flops, times_s=times):
        pass
    tracer.close()
    all_times = _gather_times(times, ctrl)
    summary = None
    if rank == 0:
        shape = {k: getattr(m, k) for k in ("arch", "layers", "hidden", "heads", "seq_len",
                                            "vocab")}
        summary = {"kind": "compute_bench", "strategy": spec.strategy, "world_size": world,
                   "backend": backend, "device": device.type,
                   "device_name": torch.cuda.get_device_name(device)
                   if device.type == "cuda" else "cpu",
                   "dtype": c.dtype, "model": shape, "batch": c.batch, "warmup": c.warmup,
                   "iters": c.iters, "flops_per_iter": flops, "flops_formula": formula,
                   **summarize(all_times, flops), "wall_s": time.perf_counter() - t_start,
                   "provenance": {"torch_threads": torch.get_num_threads(),
                                  "torch_version": torch.__version__}}
        summary["median_flops_per_s"] = summary["flops_per_s"]["median"]
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
        print(f"# compute_bench: {shape['arch']} h={m.hidden} batch {c.batch} {c.dtype} on "
              f"{world} x {summary['device_name']}: median "
              f"{summary['median_flops_per_s'] / 1e9:.3f} GFLOP/s per rank, spread "
              f"{100 * summary['flops_per_s']['spread']:.1f} % ({formula} = {flops:.4g} "
              "FLOPs per pass)", flush=True)
    dist.barrier(group=ctrl)
    dist.destroy_process_group()
    return summary


def main(argv: list[str] | None = None) -> int:
    return job_main("python -m jobs.compute_bench", "compute_bench", run, argv)


if __name__ == "__main__":
    exit_now(main())
