"""What every data-parallel strategy shares: the loop-facing interface, traced collectives,
flat parameter / gradient buffers split into reverse-order buckets, and the optimizer (Adam or
plain SGD, `train.optimizer`) on fp32 masters.

The training loop drives a strategy like this (jobs/train.py):

    strategy.zero_grad()
    for i, (x, y) in enumerate(microbatches):
        with strategy.no_sync() if i < last else nullcontext():
            strategy.backward(loss_fn(strategy.forward(x), y) / rounds)
    strategy.finish_grads()       # gradients now reduced (sum / N) where the strategy keeps them
    strategy.step()               # optimizer update + whatever parameter sync the strategy needs

Precision: fp32 keeps one fp32 copy of the parameters (Adam updates them in place); bf16 keeps
bf16 parameters and gradients for compute and communication and fp32 master weights and Adam
moments in the optimizer (the seeds' 16Ψ model); with `fp32_grads` an fp32 gradient copy too
(the 20Ψ model, counted as optimizer state as in the ZeRO paper).
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
import torch.nn as nn

from jobs.parallel.optim import EagerOptimizer
from jobs.trace import NullTracer


def own_group(dims, axis: str, rank: int) -> tuple:
    """(process group, its global ranks) of `rank` on `axis`: every rank creates every group
    of the axis, in jobs.dims' order (torch.distributed.new_group is collective)."""
    mine = None
    for ranks in dims.groups(axis):
        pg = dist.new_group(ranks)
        if rank in ranks:
            mine = (pg, ranks)
    assert mine is not None, (axis, rank)
    return mine


def tensor_bytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


def dtype_name(t: torch.Tensor) -> str:
    """'float32', 'bfloat16', ...: the dtype a comm record carries (flight recorder)."""
    return str(t.dtype).removeprefix("torch.")


def full_fp32(t: torch.Tensor) -> torch.Tensor:
    """A detached fp32 copy, gathered to full shape when `t` is a DTensor (a collective)."""
    if hasattr(t, "full_tensor"):
        t = t.full_tensor()
    return t.detach().float().clone()


class Strategy:
    """Base: replicated model, plain autograd gradients, nothing synchronised."""

    name = "single"
    engine = "reference"

    def __init__(self, model: nn.Module, group=None, tracer=None, *, lr: float = 1e-3,
                 precision: str = "fp32", fp32_grads: bool = False, bucket_mb: float = 25.0,
                 optimizer: str = "adam"):
        self.model = model
        self.group = group
        self.n = dist.get_world_size(group) if dist.is_initialized() else 1
        self.r = dist.get_rank(group) if dist.is_initialized() else 0
        self.tracer = tracer if tracer is not None else NullTracer()
        self.lr, self.precision, self.fp32_grads = lr, precision, fp32_grads
        self.optimizer = optimizer
        self.dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        self.bucket_bytes = max(1, int(bucket_mb * (1 << 20)))
        self.sync = True
        self.names = [n for n, _ in model.named_parameters()]
        self.shapes = [p.shape for _, p in model.named_parameters()]
        self.numel = sum(p.numel() for p in model.parameters())
        self.padding = 0  # elements of padding added to make shards even (per rank, summed)
        self.notes: list[str] = []

    # --- the loop-facing interface --------------------------------------------------------------
    def forward(self, *args):
        if self.dtype != torch.float32:  # bf16 compute: cast floating inputs
            args = tuple(a.to(self.dtype) if a.is_floating_point() else a for a in args)
        return self.model(*args)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    @contextlib.contextmanager
    def no_sync(self):
        """Accumulation rounds other than the last: keep gradients local where possible."""
        self.sync = False
        try:
            yield
        finally:
            self.sync = True

    def finish_grads(self) -> None:
        pass

    def comm_context(self):
        """Entered around each step's forward/backward/update (native engines capture the
        collectives PyTorch issues there)."""
        return contextlib.nullcontext()

    def step(self) -> None:
        raise NotImplementedError

    def zero_grad(self) -> None:
        for p in self.model.parameters():
            p.grad = None

    def full_parameters(self) -> dict[str, torch.Tensor]:
        """Every parameter, unsharded, as fp32 (the master copy where there is one)."""
        return {n: p.detach().float().clone() for n, p in self.model.named_parameters()}

    def full_grads(self) -> dict[str, torch.Tensor]:
        """Every parameter's gradient as the optimizer sees it (reduced and averaged), unsharded
        over dp, as fp32: the correctness gate compares it with a single process. A collective
        where gradients are sharded: every rank calls it."""
        return {n: full_fp32(p.grad) for n, p in self.model.named_parameters()
                if p.grad is not None}

    def state_bytes(self) -> dict[str, int]:
        """Bytes of parameters, gradients and optimizer state this rank holds right now."""
        raise NotImplementedError

    def layout(self) -> dict:
        """How the state is split: shard sizes, padding, buckets (for the summary)."""
        return {"psi": self.numel, "padding_elems": self.padding}

    # --- traced collectives ---------------------------------------------------------------------
    def _comm(self, op: str, fn, payload: int, *, async_op: bool = False, **kw):
        """Run `fn(async_op)` (a torch.distributed call) inside a comm record of logical size
        `payload` bytes; async: the record closes when the work's future completes."""
        if async_op:
            kw["async"] = True
        h = self.tracer.comm_start(op, payload_bytes=payload, group_size=self.n, axis="dp",
                                   group="dp", device=not async_op, **kw)
        if not async_op:
            fn(False)
            h.done()
            return None
        work = fn(True)
        try:
            work.get_future().then(lambda _f: h.done())
        except RuntimeError:  # e.g. gloo reduce-scatter: no future; completion seen at wait()
            return _WaitRecorded(work, h)
        return work

    def all_reduce(self, t: torch.Tensor, *, async_op=False, **kw):
        return self._comm("all_reduce", lambda a: dist.all_reduce(t, group=self.group,
                                                                  async_op=a),
                          tensor_bytes(t), async_op=async_op, dtype=dtype_name(t), **kw)

    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, *, async_op=False, **kw):
        return self._comm("reduce_scatter", lambda a: dist.reduce_scatter_tensor(
            out, inp, group=self.group, async_op=a), tensor_bytes(inp), async_op=async_op,
            dtype=dtype_name(inp), **kw)

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor, *, async_op=False, **kw):
        return self._comm("all_gather", lambda a: dist.all_gather_into_tensor(
            out, inp, group=self.group, async_op=a), tensor_bytes(out), async_op=async_op,
            dtype=dtype_name(inp), **kw)


class _WaitRecorded:
    """A Work whose completion is recorded when waited on (the record says so)."""

    def __init__(self, work, handle):
        self.work, self.handle = work, handle

    def wait(self):
        out = self.work.wait()
        self.handle.done(end="wait")
        return out

    def is_completed(self) -> bool:
        return self.work.is_completed()


class Buckets:
    """Parameters in reverse definition order (output layer first: their gradients are ready
    first in backward), grouped into buckets of at most `bucket_bytes` (at least one parameter
    each), each bucket padded to a multiple of `n` elements. One flat buffer holds them all;
    bucket b's shard for rank r is `flat[start_b + r*s_b : start_b + (r+1)*s_b]`."""

    def __init__(self, params: list[nn.Parameter], bucket_bytes: int, n: int, elem_size: int):
        self.params = list(reversed(params))
        self.groups: list[list[int]] = []  # indices into self.params
        cur, cur_bytes = [], 0
        for i, p in enumerate(self.params):
            b = p.numel() * elem_size
            if cur and cur_bytes + b > bucket_bytes:
                self.groups.append(cur)
                cur, cur_bytes = [], 0
            cur.append(i)
            cur_bytes += b
        if cur:
            self.groups.append(cur)
        self.offsets: list[int] = []  # element offset of each param in the flat buffer
        self.starts, self.sizes, self.padded = [], [], []
        pos = 0
        for g in self.groups:
            self.starts.append(pos)
            size = 0
            for i in g:
                self.offsets.append(pos + size)
                size += self.params[i].numel()
            pad = (-size) % n
            self.sizes.append(size)
            self.padded.append(size + pad)
            pos += size + pad
        self.total = pos
        self.n = n
        self.bucket_of = {}
        for b, g in enumerate(self.groups):
            for i in g:
                self.bucket_of[i] = b

    @property
    def padding(self) -> int:
        return self.total - sum(self.sizes)

    def bucket(self, flat: torch.Tensor, b: int) -> torch.Tensor:
        return flat[self.starts[b]:self.starts[b] + self.padded[b]]

    def shard(self, flat: torch.Tensor, b: int, r: int) -> torch.Tensor:
        s = self.padded[b] // self.n
        return flat[self.starts[b] + r * s:self.starts[b] + (r + 1) * s]

    def shard_numel(self) -> int:
        return self.total // self.n

    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        return [flat[o:o + p.numel()].view_as(p) for o, p in zip(self.offsets, self.params,
                                                                   strict=True)]

    def flatten_params_into(self, dtype: torch.dtype) -> torch.Tensor:
        """Move the parameters' storage into one flat buffer (params become views of it)."""
        flat = torch.zeros(self.total, dtype=dtype, device=self.params[0].device)
        for v, p in zip(self.views(flat), self.params, strict=True):
            v.copy_(p.detach())
            p.data = v
        return flat


class FlatOptimizer:
    """torch's Adam / SGD update over flat fp32 tensors (elementwise, so identical to the same
    optimizer on the unflattened parameters; jobs/parallel/optim.py). `master` is updated in
    place: in fp32 it is a view of the parameters themselves, in bf16 a separate fp32 copy."""

    def __init__(self, masters: list[torch.Tensor], lr: float, name: str = "adam"):
        self.params = [nn.Parameter(m, requires_grad=True) for m in masters]  # share storage
        self.opt = EagerOptimizer(self.params, name, lr)

    def step(self, grads: list[torch.Tensor]) -> None:
        for p, g in zip(self.params, grads, strict=True):
            p.grad = g if g.dtype == torch.float32 else g.float()
        self.opt.step()
        for p in self.params:
            p.grad = None

    def state_bytes(self) -> int:
        return sum(tensor_bytes(t) for s in self.opt.state.values() for t in s.values()
                   if torch.is_tensor(t) and t.numel() > 1)
