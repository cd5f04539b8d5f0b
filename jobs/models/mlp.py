"""A plain MLP stack: `layers` blocks of Linear(h, h), ReLU between them, MSE to sin(x).

Every layer is h x h plus a bias, so Ψ = layers * h * (h + 1) and each block's parameter count is
even (divisible by 4 when h % 4 in (0, 3)): with world sizes 2 and 4 ZeRO shards need no padding
and the measured traffic equals the seeds' formulas exactly.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, hidden: int, act: bool = True):
        super().__init__()
        self.fc = nn.Linear(hidden, hidden)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        return F.relu(y) if self.act else y


class MLP(nn.Module):
    def __init__(self, *, hidden: int, layers: int):
        super().__init__()
        self.blocks = nn.ModuleList(Block(hidden, act=i < layers - 1) for i in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for blk in self.blocks:
            x = blk(x)
        return x


def build(model_spec, seed: int) -> MLP:
    """Parameters depend only on the seed and the model settings."""
    torch.manual_seed(seed)
    return MLP(hidden=model_spec.hidden, layers=model_spec.layers)


def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(out, target)


def batch(model_spec, global_batch: int, seed: int, step: int):
    """One global batch: a function of (seed, step, model settings) only, never of the layout."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    x = torch.randn(global_batch, model_spec.hidden, generator=g)
    return x, torch.sin(x)
