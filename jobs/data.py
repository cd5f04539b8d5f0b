"""Seeded synthetic batches, sliced by layout.

The samples of a global batch depend only on (seed, step, model settings); a rank takes the
contiguous slice of its data-parallel index, then splits it into micro-batches. So two runs of
different strategies with the same seed see the same samples step by step, and a single process
fed the whole global batch computes the same mean loss and gradient.
"""

from __future__ import annotations

import torch

from jobs.models import model_module


def global_batch(spec, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    mod = model_module(spec.model.arch)
    return mod.batch(spec.model, spec.train.global_batch, spec.train.seed, step)


def local_microbatches(spec, step: int, dp_rank: int, dp_size: int, rounds: int,
                       device: torch.device | str = "cpu") -> list[tuple[torch.Tensor, ...]]:
    """This DP replica's slice of the global batch, split into `rounds` equal micro-batches.
    Context parallelism (cp > 1): the cp consecutive DP ranks of a CP group take the same
    samples, each only its sequence chunks (jobs.parallel.context.cp_positions)."""
    x, y = global_batch(spec, step)
    cp = getattr(spec.parallel, "cp", 1)
    if cp > 1:
        from jobs.parallel.context import cp_positions
        pos = cp_positions(spec.model.seq_len, cp, dp_rank % cp)
        x, y = x[:, pos], y[:, pos]
        dp_rank, dp_size = dp_rank // cp, dp_size // cp
    per = x.shape[0] // dp_size
    if per * dp_size != x.shape[0] or per % rounds:
        raise ValueError(f"global batch {x.shape[0]} does not split into {dp_size} replicas x "
                         f"{rounds} micro-batches")
    x, y = x[dp_rank * per:(dp_rank + 1) * per], y[dp_rank * per:(dp_rank + 1) * per]
    return [(a.to(device), b.to(device)) for a, b in zip(x.chunk(rounds), y.chunk(rounds),
                                                         strict=True)]
