"""Entry point of a training job, run on every rank by torchrun:

    torchrun --nproc-per-node N -m jobs.train --spec SPEC.json --out DIR

Writes `DIR/trace-rank{R}.jsonl` (one JSON object per line, schema in docs/trace-schema.md),
`DIR/summary.json` (rank 0) and, when a rank fails, `DIR/error-rank{R}.txt` with its traceback
so the worker can put the failing rank's error into the run's error text.

Flow: init -> dims / mesh -> tracer -> RunContext (jobs/context.py) -> one composition
(jobs/compose.py: pipeline split -> TP / SP / vocab -> activation checkpointing -> DP / ZeRO /
FSDP) -> the one loop (jobs/loop.py) -> summary (jobs/summary.py). docs/strategies.md.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

from jobs import faults
from jobs.compose import compose
from jobs.context import RunContext
from jobs.dims import ParallelDims
from jobs.dumps import dump_params
from jobs.entry import exit_now, job_main
from jobs.loop import train_loop
from jobs.spec import JobSpec
from jobs.summary import summarize
from jobs.trace import Tracer


def run(spec: JobSpec, out: Path) -> None:
    backend = spec.runtime.backend
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    try:
        run_in_group(spec, out, backend)
    finally:
        dist.destroy_process_group()


def run_in_group(spec: JobSpec, out: Path, backend: str) -> dict | None:
    """One run inside an initialised default process group; returns the summary on rank 0.
    With PARALAB_DUMP_PARAMS=1 the final parameters and step-0 gradients are dumped too
    (jobs/dumps.py)."""
    out.mkdir(parents=True, exist_ok=True)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    dims = ParallelDims.from_spec(spec, world)
    mesh = dims.build_mesh(device.type)
    tracer = Tracer(out, rank, world, coords=dims.coords(rank),
                    meta={"backend": backend, "spec": spec.to_dict(), "strategy": spec.strategy},
                    cuda_events=device.type == "cuda")
    injector = faults.install(spec, out, rank, world, dims, tracer)  # docs/faults.md
    ctx = RunContext(spec, out, rank, world, backend, device, dims, mesh, tracer)
    summary = None
    try:
        comp = compose(ctx)
        injector.attach(comp)
        result = train_loop(ctx, comp)
        if os.environ.get("PARALAB_DUMP_PARAMS") == "1":
            dump_params(ctx, comp)
        tracer.flush()
        dist.barrier()  # every trace on disk before rank 0 reads them for the summary
        gathered: list = [None] * world
        dist.all_gather_object(gathered, result)
        if rank == 0:
            summary = summarize(ctx, gathered, comp)
            (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
            if summary.get("loss"):
                print(f"done: {len(summary['loss'])} steps, final loss "
                      f"{summary['loss'][-1]:.6f} (global batch)", flush=True)
        tracer.close("ok")
    except BaseException as exc:
        tracer.close(f"error: {type(exc).__name__}")
        raise
    return summary


def main(argv: list[str] | None = None) -> int:
    return job_main("python -m jobs.train", "train", run, argv)


if __name__ == "__main__":
    exit_now(main())
