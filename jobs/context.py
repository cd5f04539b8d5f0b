"""RunContext: what the composition, the training loop and the summary of one run share on a
rank (passed explicitly; built once by jobs/train.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from jobs.dims import ParallelDims
from jobs.spec import JobSpec
from jobs.trace import Tracer


@dataclass
class RunContext:
    spec: JobSpec
    out: Path
    rank: int
    world: int
    backend: str
    device: torch.device
    dims: ParallelDims
    mesh: object
    tracer: Tracer
    partition: dict | None = None  # pipeline stage split, set by jobs.compose.split_stages
    start_step: int = 0  # first step to run: steps completed by the checkpoint resumed from
