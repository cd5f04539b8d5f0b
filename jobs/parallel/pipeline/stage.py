"""Split a finished plain model into pipeline stages.

A model is seen as `embed` (optional: gpt), the repeated `blocks` / `layers` and `head`
(optional: gpt). With p ranks and v chunks per rank there are p*v model stages; global stage
s = jobs.schedules.stage_of(rank, chunk, p, v, placement): "loop" (the default) is
chunk * p + rank (Megatron's interleaved placement; v = 1 gives stage = rank); "v" (zbv, v = 2)
gives rank r stages r and 2p-1-r, so rank 0 holds both the first and the last stage. Stage 0
also holds the embedding, the last stage the head. Layers are split evenly by count, or by
measured cost with `partition_by_cost` (contiguous, minimising the most expensive stage).
"""

from __future__ import annotations

import statistics
import time

import torch.nn as nn

from jobs.models import layer_list
from jobs.schedules import stage_of


class Stage(nn.Module):
    """One model stage: optional embed, a run of blocks, optional head. Attribute names match
    the GPT's so tensor parallelism and ZeRO apply to a stage as to a whole model."""

    def __init__(self, embed: nn.Module | None, blocks: list[nn.Module], head: nn.Module | None,
                 index: int, first_layer: int):
        super().__init__()
        self.embed, self.head = embed, head
        self.blocks = nn.ModuleList(blocks)
        self.index, self.first_layer = index, first_layer

    def forward(self, x):
        if self.embed is not None:
            x = self.embed(x)
        for blk in self.blocks:
            x = blk(x)
        if self.head is not None:
            x = self.head(x)
        return x


def partition_even(n_layers: int, n_stages: int) -> list[int]:
    """Layers per stage, even by count (the first stages take one more when it does not divide)."""
    if n_stages < 1 or n_layers < n_stages:
        raise ValueError(f"cannot split {n_layers} layers into {n_stages} stages")
    q, r = divmod(n_layers, n_stages)
    return [q + (i < r) for i in range(n_stages)]


def partition_by_cost(costs: list[float], n_stages: int) -> list[int]:
    """Layers per stage, contiguous, minimising the largest stage cost (exact DP, O(n^2 k))."""
    n = len(costs)
    if n_stages < 1 or n < n_stages:
        raise ValueError(f"cannot split {n} layers into {n_stages} stages")
    pre = [0.0]
    for c in costs:
        pre.append(pre[-1] + c)
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(n_stages + 1)]
    cut = [[0] * (n + 1) for _ in range(n_stages + 1)]
    best[0][0] = 0.0
    for k in range(1, n_stages + 1):
        for j in range(k, n - (n_stages - k) + 1):
            for i in range(k - 1, j):
                val = max(best[k - 1][i], pre[j] - pre[i])
                if val < best[k][j]:
                    best[k][j], cut[k][j] = val, i
    sizes, j = [], n
    for k in range(n_stages, 0, -1):
        i = cut[k][j]
        sizes.append(j - i)
        j = i
    return sizes[::-1]


def split_stages(model: nn.Module, p: int, v: int, rank: int,
                 sizes: list[int] | None = None, placement: str = "loop") -> dict[int, Stage]:
    """This pipeline rank's stages {chunk: Stage}; the rest of the model is dropped.
    `placement` is "loop" or "v" (`jobs.schedules.placement_of(schedule)`)."""
    layers = layer_list(model)
    if layers is None:
        raise ValueError(f"{type(model).__name__} has no blocks/layers to split into stages")
    n_stages = p * v
    sizes = sizes or partition_even(len(layers), n_stages)
    starts = [sum(sizes[:i]) for i in range(n_stages)]
    out = {}
    for chunk in range(v):
        s = stage_of(rank, chunk, p, v, placement)
        out[chunk] = Stage(getattr(model, "embed", None) if s == 0 else None,
                           list(layers[starts[s]:starts[s] + sizes[s]]),
                           getattr(model, "head", None) if s == n_stages - 1 else None,
                           index=s, first_layer=starts[s])
    return out


def measure_layer_costs(model: nn.Module, x, y, loss_fn, reps: int = 3) -> list[float]:
    """Seconds of forward + backward of each layer on one micro-batch (x, y), median of `reps`,
    run layer by layer on the full model. The embedding's cost is counted with the first layer
    and the head's (with the loss) with the last, where `split_stages` puts them; the first
    layer computes no input gradient, as on a pipeline's first stage."""
    layers = layer_list(model)
    if layers is None:
        raise ValueError(f"{type(model).__name__} has no blocks/layers to split into stages")
    embed, head = getattr(model, "embed", None), getattr(model, "head", None)
    parts = [[lyr] for lyr in layers]
    if embed is not None:
        parts[0].insert(0, embed)
    if head is not None:
        parts[-1].append(head)
    samples: list[list[float]] = [[] for _ in parts]
    for _ in range(reps + 1):  # the first round warms up allocators and kernels
        h = x
        for i, mods in enumerate(parts):
            inp = h.detach().requires_grad_(i > 0 and h.is_floating_point())
            t0 = time.perf_counter()
            out = inp
            for mod in mods:
                out = mod(out)
            last = i == len(parts) - 1
            (loss_fn(out, y) if last else out.sum()).backward()
            samples[i].append(time.perf_counter() - t0)
            h = out.detach()
    model.zero_grad(set_to_none=True)
    return [statistics.median(s[1:]) for s in samples]
