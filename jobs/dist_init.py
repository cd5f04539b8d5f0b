"""The process group of a single-shot bench job (collective sweep, compute calibration): the
backend `runtime.backend` names ('auto': nccl with CUDA, else gloo), this rank's device, and a
gloo control group for the timings when the data backend is not gloo."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def init_bench_group(backend: str):
    """(backend, rank, world, device, ctrl): ctrl is None when the backend is gloo itself."""
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" \
        else torch.device("cpu")
    ctrl = dist.new_group(backend="gloo") if backend != "gloo" else None
    return backend, rank, world, device, ctrl
