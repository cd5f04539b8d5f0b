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
from jobs.ckpt import (
    archive_previous_attempt,
    attempt_number,
    check_supported,
    load,
)
from jobs.ckpt_index import latest_checkpoint
from jobs.compose import compose
from jobs.context import RunContext
from jobs.dims import ParallelDims
from jobs.dumps import dump_params
from jobs.entry import exit_now, host_meta, job_main
from jobs.loop import train_loop
from jobs.spec import JobSpec
from jobs.summary import summarize
from jobs.trace import Tracer


def run(spec: JobSpec, out: Path, resume: Path | None = None) -> None:
    backend = spec.runtime.backend
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    init_group(backend)
    try:
        run_in_group(spec, out, backend, resume=resume)
    finally:
        dist.destroy_process_group()


def init_group(backend: str) -> None:
    """The default process group. After a torchrun restart its keys go under a prefix of
    their own: torchrun's agent store outlives the attempt, and a restarted rank could read the
    previous attempt's gloo addresses before their new values were written (seen: "Gloo
    connectFullMesh failed ... Connection refused" in one restart out of four)."""
    attempt = attempt_number()
    if attempt == 0:
        dist.init_process_group(backend)
        return
    store, rank, world = next(dist.rendezvous("env://"))
    dist.init_process_group(backend, store=dist.PrefixStore(f"paralab/attempt-{attempt}", store),
                            rank=rank, world_size=world)


def run_in_group(spec: JobSpec, out: Path, backend: str,
                 resume: Path | None = None) -> dict | None:
    """One run inside an initialised default process group; returns the summary on rank 0.
    With PARALAB_DUMP_PARAMS=1 the final parameters and step-0 gradients are dumped too
    (jobs/dumps.py). `resume`: a checkpoint step folder to continue from; on a torchrun
    restart (attempt > 0) the latest complete checkpoint in `out` (docs/checkpoints.md)."""
    out.mkdir(parents=True, exist_ok=True)
    rank, world = dist.get_rank(), dist.get_world_size()
    attempt = attempt_number()
    archive_previous_attempt(out, rank, attempt)
    last = latest_checkpoint(out) if attempt > 0 else None
    if last is not None:  # a restart continues from its own latest complete checkpoint, else
        resume = Path(last["path"])  # from where the first attempt started (--resume or 0)
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    dims = ParallelDims.from_spec(spec, world)
    mesh = dims.build_mesh(device.type)
    tracer = Tracer(out, rank, world, coords=dims.coords(rank),
                    meta={"backend": backend, "spec": spec.to_dict(), "strategy": spec.strategy,
                          "attempt": attempt, **host_meta(),
                          "resume_path": str(resume) if resume is not None else None},
                    cuda_events=device.type == "cuda")
    injector = faults.install(spec, out, rank, world, dims, tracer)  # docs/faults.md
    ctx = RunContext(spec, out, rank, world, backend, device, dims, mesh, tracer)
    summary = None
    try:
        comp = compose(ctx)
        if spec.train.checkpoint_every or resume is not None:
            check_supported(comp)  # refused before the first step, not at the first save
        if resume is not None:
            ctx.start_step = load(ctx, comp, resume)
            if attempt == 0 and spec.resume.run_id and ctx.start_step != spec.resume.step:
                raise ValueError(f"--resume {resume} holds step {ctx.start_step}, the spec's "
                                 f"resume.step is {spec.resume.step}")
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
