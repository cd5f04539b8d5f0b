"""Synthetic layers with a known cost: forward, input-gradient backward and weight-gradient
backward each sleep a configured time, independent of core count and load.

Each layer still does a tiny real linear map (`y = x W^T + b`), so activations, gradients and
pipeline point-to-point traffic flow and results can be compared against a single-process run.

Zero-bubble schedules split backward: set `layer.defer_weight_grad = True` and the backward pass
computes only the input gradient (sleeping `t_backward_input`), keeping what the weight gradient
needs under the key `layer.wgrad_key`; `layer.backward_weight(key)` later does that work
(sleeping `t_backward_weight`). With the flag off (the default) backward does both.
"""

from __future__ import annotations

import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def _sleep(seconds: float) -> None:
    if seconds > 0:
        time.sleep(seconds)


class _TimedLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, layer):
        _sleep(layer.t_forward)
        ctx.save_for_backward(x, weight)
        ctx.layer = layer
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, gy):
        x, weight = ctx.saved_tensors
        layer = ctx.layer
        _sleep(layer.t_backward_input)
        gx = gy @ weight if ctx.needs_input_grad[0] else None
        if layer.defer_weight_grad:
            layer.pending[layer.wgrad_key] = (x.detach(), gy.detach())
            return gx, None, None, None
        _sleep(layer.t_backward_weight)
        gw, gb = _weight_grads(x, gy)
        return gx, gw, gb, None


def _weight_grads(x: torch.Tensor, gy: torch.Tensor):
    x2, g2 = x.reshape(-1, x.shape[-1]), gy.reshape(-1, gy.shape[-1])
    return g2.t() @ x2, g2.sum(0)


class TimedLayer(nn.Module):
    def __init__(self, hidden: int, t_forward: float, t_backward_input: float,
                 t_backward_weight: float):
        super().__init__()
        self.weight = nn.Parameter(torch.eye(hidden) + 0.05 * torch.randn(hidden, hidden))
        self.bias = nn.Parameter(0.05 * torch.randn(hidden))
        self.t_forward, self.t_backward_input = t_forward, t_backward_input
        self.t_backward_weight = t_backward_weight
        self.defer_weight_grad = False
        self.wgrad_key = None
        self.pending: dict = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _TimedLinear.apply(x, self.weight, self.bias, self)

    def backward_weight(self, key=None) -> None:
        """The deferred weight-gradient work for `key` (accumulated into .grad)."""
        x, gy = self.pending.pop(key)
        _sleep(self.t_backward_weight)
        gw, gb = _weight_grads(x, gy)
        for p, g in ((self.weight, gw), (self.bias, gb)):
            if p.grad is None:
                p.grad = g
            else:  # in place: strategies keep .grad as views of flat buffers
                p.grad.add_(g)


class TimedModel(nn.Module):
    def __init__(self, *, hidden: int, layers: int, t_forward: float, t_backward_input: float,
                 t_backward_weight: float):
        super().__init__()
        self.layers = nn.ModuleList(
            TimedLayer(hidden, t_forward, t_backward_input, t_backward_weight)
            for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def build(model_spec, seed: int) -> TimedModel:
    torch.manual_seed(seed)
    m = model_spec
    return TimedModel(hidden=m.hidden, layers=m.layers, t_forward=m.t_forward,
                      t_backward_input=m.t_backward_input, t_backward_weight=m.t_backward_weight)


def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(out, target)


def batch(model_spec, global_batch: int, seed: int, step: int):
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    x = torch.randn(global_batch, model_spec.hidden, generator=g)
    return x, torch.sin(x)
