"""Replicated data parallelism, reference engine: parameter server (seed 001), all-reduce after
backward (seed 004) and bucketed DDP overlapped with backward (seed 001).

All three keep a full replica of parameters and gradients on every rank, in flat buffers
(parameters and `.grad` are views), so a DDP bucket is a contiguous slice reduced in place.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from jobs.parallel.base import Buckets, FlatOptimizer, Strategy, tensor_bytes
from jobs.testbug import dp_divisor


class Replicated(Strategy):
    """Full parameters and gradients everywhere; subclasses decide how gradients meet."""

    owns_optimizer = True  # False on parameter-server workers

    def __init__(self, model, group=None, tracer=None, **kw):
        super().__init__(model, group, tracer, **kw)
        model.to(self.dtype)
        params = list(model.parameters())
        self.bk = Buckets(params, self.bucket_bytes, 1, params[0].element_size())
        self.flat = self.bk.flatten_params_into(self.dtype)
        self.gflat = torch.zeros_like(self.flat)
        self._bind_grads()
        self.opt = self.master = self.grad32 = None
        self.comm_peak = 0  # collective buffers beyond the flat state (parameter server)
        if self.owns_optimizer:
            self.master = self.flat if self.dtype == torch.float32 else self.flat.float()
            self.opt = FlatOptimizer([self.master], self.lr, self.optimizer)
            if self.fp32_grads:
                self.grad32 = torch.zeros_like(self.master)

    def _bind_grads(self) -> None:
        for v, p in zip(self.bk.views(self.gflat), self.bk.params, strict=True):
            p.grad = v

    def zero_grad(self) -> None:
        self.gflat.zero_()
        self._bind_grads()

    def _update(self) -> None:
        """The optimizer on the (already averaged) flat gradient; refresh the bf16 compute copy."""
        g = self.gflat
        if self.grad32 is not None:
            g = self.grad32.copy_(self.gflat)
        self.opt.step([g])
        if self.master is not self.flat:
            self.flat.copy_(self.master)

    def step(self) -> None:
        with self.tracer.span("optimizer", cat="compute"):
            self._update()

    def full_parameters(self):
        return self._by_name(self.master if self.master is not None else self.flat.float())

    def full_grads(self):
        return self._by_name(self.gflat.float())

    def _by_name(self, src):
        views = dict(zip([id(p) for p in self.bk.params], self.bk.views(src), strict=True))
        return {n: views[id(p)].detach().clone()
                for n, p in self.model.named_parameters()}

    def state_bytes(self):
        optim = (self.opt.state_bytes() if self.opt else 0)
        if self.master is not None and self.master is not self.flat:
            optim += tensor_bytes(self.master)
        optim += tensor_bytes(self.grad32)
        return {"params": tensor_bytes(self.flat), "grads": tensor_bytes(self.gflat),
                "optimizer": optim, "comm_buffers": self.comm_peak}

    def layout(self):
        return {**super().layout(), "buckets": len(self.bk.groups),
                "bucket_elems": list(self.bk.sizes)}


class AllReduceDP(Replicated):
    """Seed 004: after backward, all-reduce every parameter's gradient, then average."""

    name = "dp-allreduce"

    def finish_grads(self) -> None:
        for name, p in self.model.named_parameters():
            self.all_reduce(p.grad, param=name)
        self.gflat.div_(dp_divisor(self.n))


class DDP(Replicated):
    """Seed 001: reverse-order buckets; a bucket's all-reduce is launched (async) as soon as
    every gradient in it has been accumulated, while backward carries on with earlier layers."""

    name = "ddp"

    def __init__(self, model, group=None, tracer=None, **kw):
        super().__init__(model, group, tracer, **kw)
        self.pending = [len(g) for g in self.bk.groups]
        self.works: dict[int, object] = {}
        for i, p in enumerate(self.bk.params):
            p.register_post_accumulate_grad_hook(lambda _p, i=i: self._ready(i))

    def _ready(self, i: int) -> None:
        b = self.bk.bucket_of[i]
        self.pending[b] -= 1
        if self.pending[b] == 0 and self.sync:
            self._launch(b)

    def _launch(self, b: int) -> None:
        self.works[b] = self.all_reduce(self.bk.bucket(self.gflat, b), async_op=True, bucket=b)

    def finish_grads(self) -> None:
        for b in range(len(self.bk.groups)):  # buckets whose gradients never arrived
            if b not in self.works:
                self._launch(b)
        with self.tracer.span("wait_grads", cat="comm_wait"):
            for b in sorted(self.works):
                self.works[b].wait()
        self.works.clear()
        self.pending = [len(g) for g in self.bk.groups]
        self.gflat.div_(dp_divisor(self.n))

    def zero_grad(self) -> None:
        super().zero_grad()
        self.pending = [len(g) for g in self.bk.groups]


class ParameterServerDP(Replicated):
    """Seed 001: every worker sends its gradients to rank 0, rank 0 averages and updates (it
    alone holds optimizer state) and sends the parameters back to every worker. Rank 0 moves
    (N-1)Ψ each way, a worker Ψ each way: point-to-point sends, recorded as such."""

    name = "dp-ps"
    root = 0

    def __init__(self, model, group=None, tracer=None, **kw):
        self.owns_optimizer = (dist.get_rank(group) == self.root)
        super().__init__(model, group, tracer, **kw)

    def _p2p(self, op: str, t: torch.Tensor, peer: int, what: str):
        h = self.tracer.comm_start(op, payload_bytes=tensor_bytes(t), group_size=self.n,
                                   axis="dp", group=f"dp:p2p:{min(self.r, peer)}-"
                                   f"{max(self.r, peer)}", peer=peer, what=what,
                                   device=False, **{"async": True})
        fn = dist.isend if op == "send" else dist.irecv
        kw = {"group_dst": peer} if op == "send" else {"group_src": peer}
        return fn(t, group=self.group, **kw), h

    def _wait(self, ops) -> None:
        for work, h in ops:
            work.wait()
            h.done()

    def finish_grads(self) -> None:
        if self.r == self.root:
            bufs = {w: torch.empty_like(self.gflat) for w in range(self.n) if w != self.root}
            self.comm_peak = max(self.comm_peak, sum(tensor_bytes(b) for b in bufs.values()))
            self._wait([self._p2p("recv", b, w, "grads") for w, b in bufs.items()])
            for b in bufs.values():
                self.gflat.add_(b)
            self.gflat.div_(dp_divisor(self.n))
        else:
            self._wait([self._p2p("send", self.gflat, self.root, "grads")])

    def step(self) -> None:
        if self.r == self.root:
            with self.tracer.span("optimizer", cat="compute"):
                self._update()
            self._wait([self._p2p("send", self.flat, w, "params")
                        for w in range(self.n) if w != self.root])
        else:
            self._wait([self._p2p("recv", self.flat, self.root, "params")])


class Single(Replicated):
    """One replica (dp = 1): no communication."""

    name = "single"

    def __init__(self, model, group=None, tracer=None, **kw):
        super().__init__(model, None, tracer, **kw)
        self.n, self.r = 1, 0  # no DP peers, whatever the world size (tp/pp runs)
