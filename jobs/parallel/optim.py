"""The optimizer of `train.optimizer`: torch.optim.Adam or plain torch.optim.SGD.

The reference engines step it through `EagerOptimizer`: the function torch's own `Adam.step` /
`SGD.step` call (`torch.optim.adam.adam`, `torch.optim.sgd.sgd`, torch's documented functional
form) with the class's defaults, read from the class's signature, and the class's state layout
(`state[param]`: a float32 "step" tensor, "exp_avg" and "exp_avg_sq"; SGD without momentum keeps
none), so checkpoints and the memory accounting read it as they read torch's.

Why not the class itself: `torch.optim.Optimizer` imports torch._dynamo on its first parameter
group and on every step (graph breaks for torch.compile). With what that brings in (DTensor,
sympy) it cost a rank 1.45 of its 3.08 CPU-s before the first step (bench/rank_startup.py,
docs/benchmarks.md); a job that never compiles needs none of it. Native engines keep the
classes: they run torch's own stack and import it anyway. tests/jobs/test_optim.py holds the
update bit-for-bit equal to the class's.
"""

from __future__ import annotations

import inspect

import torch
from torch.optim.adam import adam as adam_update  # torch.optim deletes its submodule names
from torch.optim.sgd import sgd as sgd_update

OPTIMIZERS = {"adam": torch.optim.Adam, "sgd": torch.optim.SGD}


def optimizer_class(name: str):
    """The torch optimizer class for `train.optimizer` (the one table every engine uses)."""
    return OPTIMIZERS[name]


def make_optimizer(params, name: str, lr: float) -> torch.optim.Optimizer:
    """torch's own optimizer object (the native engines, and the checkpoint's param_groups)."""
    return OPTIMIZERS[name](params, lr=lr)


def _defaults(cls) -> dict:
    return {k: p.default for k, p in inspect.signature(cls.__init__).parameters.items()
            if p.default is not inspect.Parameter.empty}


class EagerOptimizer:
    """torch's Adam / SGD update over `params` (their `.grad`), without torch.optim.Optimizer."""

    def __init__(self, params, name: str, lr: float):
        self.params = list(params)
        assert self.params, "an optimizer over no parameters"
        self.name = name
        self.lr = lr
        d = _defaults(OPTIMIZERS[name])
        # what this class implements of torch's options: their defaults, which paralab keeps
        assert not d.get("amsgrad") and not d.get("capturable") and not d.get("differentiable")
        assert not d.get("maximize") and not d.get("decoupled_weight_decay")
        self.defaults = d
        self.state: dict = {}

    @torch.no_grad()
    def step(self) -> None:
        ps = [p for p in self.params if p.grad is not None]
        grads = [p.grad for p in ps]
        d = self.defaults
        if self.name == "sgd":
            bufs = [self.state.get(p, {}).get("momentum_buffer") for p in ps]
            sgd_update(ps, grads, bufs, foreach=d["foreach"], fused=d["fused"],
                       weight_decay=d["weight_decay"], momentum=d["momentum"], lr=self.lr,
                       dampening=d["dampening"], nesterov=d["nesterov"], maximize=False)
            if d["momentum"] != 0:
                for p, b in zip(ps, bufs, strict=True):
                    self.state.setdefault(p, {})["momentum_buffer"] = b
            return
        for p in ps:
            if p not in self.state:
                self.state[p] = {
                    "step": torch.tensor(0.0, dtype=torch.float32),
                    "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                    "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}
        st = [self.state[p] for p in ps]
        beta1, beta2 = d["betas"]
        cols, steps, counted = _chunked(ps, grads, st)
        adam_update(
            *cols, [], steps, foreach=d["foreach"], fused=d["fused"],
            has_complex=any(torch.is_complex(p) for p in ps), amsgrad=False, beta1=beta1,
            beta2=beta2, lr=self.lr, weight_decay=d["weight_decay"], eps=d["eps"],
            maximize=False)
        for owner, chunk_step in counted:  # a chunked parameter's state takes its chunks' count
            owner.copy_(chunk_step)


# Adam reads and writes the parameter, its gradient and both moments in several passes (lerp,
# mul, addcmul, sqrt, div, addcdiv), each with a temporary as large as the tensor. On a CPU a
# flat buffer of a few MB makes every pass stream from memory; cut into chunks of
# CPU_CHUNK_BYTES the passes of a chunk stay in cache. Measured on the reference engines' 2 MB
# flat buffer: 4.7 ms a step whole, 1.5 ms in 256 KiB chunks, torch's class over the same
# elements as 8 parameters 1.3 ms (bench/optimizer_chunks.py, docs/benchmarks.md). The update
# is elementwise, so a chunk's result is bit for bit the whole tensor's
# (tests/jobs/test_optim.py). On a GPU one kernel per pass over the whole buffer is what is
# fast: no chunks there.
CPU_CHUNK_BYTES = 256 << 10


def _chunked(ps, grads, st) -> tuple[tuple[list, list, list, list], list, list[tuple]]:
    """(params, grads, exp_avgs, exp_avg_sqs) with every large contiguous CPU parameter cut
    into chunk views; the step tensors to pass, one per entry; and [(a chunked parameter's
    state step, one of its chunks' steps)] to copy back: each chunk needs a counter of its own,
    since adam increments every counter it is given."""
    cols: tuple[list, list, list, list] = ([], [], [], [])
    steps, counted = [], []
    for p, g, s in zip(ps, grads, st, strict=True):
        ts = (p, g, s["exp_avg"], s["exp_avg_sq"])
        n = max(1, CPU_CHUNK_BYTES // p.element_size())
        if p.device.type != "cpu" or p.numel() <= n or not all(t.is_contiguous() for t in ts):
            for col, t in zip(cols, ts, strict=True):
                col.append(t)
            steps.append(s["step"])
            continue
        parts = [t.view(-1).split(n) for t in ts]
        for col, part in zip(cols, parts, strict=True):
            col.extend(part)
        mine = [s["step"].clone() for _ in parts[0]]
        steps.extend(mine)
        counted.append((s["step"], mine[0]))
    return cols, steps, counted
