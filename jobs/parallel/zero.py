"""ZeRO stages 1-3, reference engine, written from seeds 000/001/004 with explicit collectives.

ZeRO-1  full parameters and gradients; Adam state (and fp32 masters in bf16) only for this
        rank's shard. After backward: reduce-scatter gradients bucket by bucket, update the own
        shard, all-gather parameters.                      traffic (N-1)/N·Ψ + (N-1)/N·Ψ
ZeRO-2  as ZeRO-1, but each bucket's gradients are reduce-scattered as soon as the bucket is
        complete in backward and the full gradients are freed: a rank keeps only its shard.
ZeRO-3  parameters sharded too. Each layer (and the root's remaining parameters) is a unit:
        all-gathered before its forward, freed after it; gathered again in backward when
        autograd needs the saved weights (saved-tensor hooks), freed after; gradients
        reduce-scattered in backward.                      traffic 3·(N-1)/N·Ψ = 1.5 × DDP

Buckets / units are padded to a multiple of N elements; the padding is reported in `layout()`.
With gradient accumulation ZeRO-2/3 reduce-scatter every round (they keep no full gradients to
accumulate into), ZeRO-1 once per step, like DDP under `no_sync`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from jobs.models import layer_list
from jobs.parallel.base import Buckets, FlatOptimizer, Strategy, tensor_bytes
from jobs.testbug import dp_divisor


class Zero12(Strategy):
    def __init__(self, model, group=None, tracer=None, *, stage: int = 1, **kw):
        super().__init__(model, group, tracer, **kw)
        self.stage = stage
        self.name = f"zero{stage}"
        model.to(self.dtype)
        params = list(model.parameters())
        self.bk = bk = Buckets(params, self.bucket_bytes, self.n, params[0].element_size())
        self.padding = bk.padding
        self.flat = bk.flatten_params_into(self.dtype)
        nb = len(bk.groups)
        own = [bk.shard(self.flat, b, self.r) for b in range(nb)]
        self.fp32_master = self.dtype == torch.float32
        self.master = own if self.fp32_master else [s.float() for s in own]
        self.opt = FlatOptimizer(self.master, self.lr, self.optimizer)
        self.grad32 = [torch.zeros_like(m) for m in self.master] if self.fp32_grads else None
        self.comm_peak = 0  # bytes of collective buffers alive at once (not the flat state)
        if stage == 1:
            self.gflat = torch.zeros_like(self.flat)
            self.gshard = [bk.shard(self.gflat, b, self.r) for b in range(nb)]
            self._bind_grads()
        else:
            self.gflat = None
            self.gshard = [torch.zeros_like(s) for s in own]
            self.pending = [len(g) for g in bk.groups]
            self.inflight: list = []
            self.grads_peak = 0  # full bucket gradients alive during backward, at most
            for i, p in enumerate(bk.params):
                p.register_post_accumulate_grad_hook(lambda _p, i=i: self._ready(i))

    def _bind_grads(self) -> None:
        for v, p in zip(self.bk.views(self.gflat), self.bk.params, strict=True):
            p.grad = v

    def zero_grad(self) -> None:
        if self.stage == 1:
            self.gflat.zero_()
            self._bind_grads()
        else:
            for g in self.gshard:
                g.zero_()
            for p in self.bk.params:
                p.grad = None
            self.pending = [len(g) for g in self.bk.groups]
            self.grads_peak = 0

    # --- ZeRO-2: reduce-scatter as buckets fill --------------------------------------------------
    def _ready(self, i: int) -> None:
        b = self.bk.bucket_of[i]
        self.pending[b] -= 1
        if self.pending[b]:
            return
        self.pending[b] = len(self.bk.groups[b])
        ps = [self.bk.params[j] for j in self.bk.groups[b]]
        buf = torch.zeros(self.bk.padded[b], dtype=self.dtype, device=self.flat.device)
        torch.cat([p.grad.reshape(-1) for p in ps], out=buf[:self.bk.sizes[b]])
        for p in ps:
            p.grad = None  # this rank keeps only its shard of the reduced gradient
        out = torch.empty(self.bk.padded[b] // self.n, dtype=self.dtype, device=buf.device)
        work = self.reduce_scatter(out, buf, async_op=True, bucket=b)
        self.inflight.append((b, work, buf, out))
        live = sum(tensor_bytes(f[2]) + tensor_bytes(f[3]) for f in self.inflight)
        self.comm_peak = max(self.comm_peak, live)
        self.grads_peak = max(self.grads_peak, live + sum(tensor_bytes(g) for g in self.gshard)
                              + sum(tensor_bytes(p.grad) for p in self.bk.params))
        self._drain(block=False)

    def _drain(self, block: bool) -> None:
        """Fold completed reduce-scatters into the shard and free their full buffers."""
        keep = []
        for b, work, buf, out in self.inflight:
            if block or work.is_completed():
                work.wait()
                self.gshard[b].add_(out)
            else:
                keep.append((b, work, buf, out))
        self.inflight = keep

    def finish_grads(self) -> None:
        if self.stage == 1:
            for b in range(len(self.bk.groups)):
                out = torch.empty_like(self.gshard[b])
                self.comm_peak = max(self.comm_peak, tensor_bytes(out))
                self.reduce_scatter(out, self.bk.bucket(self.gflat, b), bucket=b)
                self.gshard[b].copy_(out)
        else:
            with self.tracer.span("wait_grads", cat="comm_wait"):
                self._drain(block=True)
        for g in self.gshard:
            g.div_(dp_divisor(self.n))

    def step(self) -> None:
        with self.tracer.span("optimizer", cat="compute"):
            grads = self.gshard
            if self.grad32 is not None:
                grads = [g32.copy_(g) for g32, g in zip(self.grad32, self.gshard, strict=True)]
            self.opt.step(grads)
            if not self.fp32_master:
                for b, m in enumerate(self.master):
                    self.bk.shard(self.flat, b, self.r).copy_(m)
        for b in range(len(self.bk.groups)):
            mine = self.bk.shard(self.flat, b, self.r).clone()
            self.comm_peak = max(self.comm_peak, tensor_bytes(mine))
            self.all_gather(self.bk.bucket(self.flat, b), mine, bucket=b, phase="update")

    def full_parameters(self):
        return self._gather(self.master)

    def full_grads(self):
        return self._gather(self.gshard)

    def _gather(self, shards):
        full = torch.zeros(self.bk.total, dtype=torch.float32, device=self.flat.device)
        for b, m in enumerate(shards):
            dist.all_gather_into_tensor(self.bk.bucket(full, b), m.detach().float().clone(),
                                        group=self.group)
        views = dict(zip([id(p) for p in self.bk.params], self.bk.views(full), strict=True))
        return {n: views[id(p)].clone() for n, p in self.model.named_parameters()}

    def state_bytes(self):
        grads = (tensor_bytes(self.gflat) if self.stage == 1 else
                 sum(tensor_bytes(g) for g in self.gshard)
                 + sum(tensor_bytes(p.grad) for p in self.bk.params))
        optim = self.opt.state_bytes() + sum(tensor_bytes(g) for g in self.grad32 or [])
        if not self.fp32_master:
            optim += sum(tensor_bytes(m) for m in self.master)
        out = {"params": tensor_bytes(self.flat), "grads": grads, "optimizer": optim,
               "comm_buffers": self.comm_peak}
        if self.stage == 2:
            out["grads_peak"] = max(self.grads_peak, grads)
        return out

    def layout(self):
        return {**super().layout(), "buckets": len(self.bk.groups),
                "bucket_elems": list(self.bk.sizes), "bucket_padded": list(self.bk.padded),
                "shard_elems": self.bk.shard_numel()}


class _Gather(torch.autograd.Function):
    """shard -> full (all-gather) forward; grad full -> grad shard (reduce-scatter) backward."""

    @staticmethod
    def forward(ctx, shard, unit):
        ctx.unit = unit
        return unit.gather("forward")

    @staticmethod
    def backward(ctx, grad_full):
        unit = ctx.unit
        # the unit's full gradient exists here while its full parameters are still gathered:
        # the transient peak (seed 003) is parameters + gradient of one unit
        unit.owner.gathered(+tensor_bytes(grad_full))
        unit.release_backward()
        out = torch.empty(unit.shard_numel, dtype=grad_full.dtype, device=grad_full.device)
        unit.owner.reduce_scatter(out, grad_full.contiguous(), unit=unit.index)
        unit.owner.gathered(-tensor_bytes(grad_full))
        return out.div_(dp_divisor(unit.owner.n)), None


class _Unit:
    def __init__(self, owner: Zero3, index: int, entries: list[tuple[nn.Module, str, str]]):
        self.owner, self.index, self.entries = owner, index, entries
        ps = [m._parameters[k] for m, k, _ in entries]
        self.shapes = [p.shape for p in ps]
        self.numel = sum(p.numel() for p in ps)
        n = owner.n
        self.padded = self.numel + (-self.numel) % n
        self.shard_numel = self.padded // n
        self.device = ps[0].device if ps else torch.device("cpu")
        flat = torch.zeros(self.padded, dtype=owner.dtype, device=self.device)
        if ps:
            torch.cat([p.detach().reshape(-1).to(owner.dtype) for p in ps], out=flat[:self.numel])
        r = owner.r
        self.shard = nn.Parameter(flat[r * self.shard_numel:(r + 1) * self.shard_numel].clone())
        for m, k, _ in entries:
            m._parameters[k] = None  # the full parameter is gone; only the shard stays
        self.bwd_full = None

    def gather(self, phase: str) -> torch.Tensor:
        full = torch.empty(self.padded, dtype=self.owner.dtype, device=self.device)
        self.owner.all_gather(full, self.shard.detach(), unit=self.index, phase=phase)
        self.owner.gathered(+tensor_bytes(full))
        return full

    def install(self, full: torch.Tensor) -> None:
        off = 0
        for (m, k, _), shape in zip(self.entries, self.shapes, strict=True):
            size = shape.numel()
            m._parameters[k] = full[off:off + size].view(shape)
            off += size

    def uninstall(self) -> None:
        for m, k, _ in self.entries:
            m._parameters[k] = None

    def backward_full(self) -> torch.Tensor:
        if self.bwd_full is None:
            self.bwd_full = self.gather("backward")
        return self.bwd_full

    def prefetch_backward(self) -> None:
        self.backward_full()

    def release_backward(self) -> None:
        if self.bwd_full is not None:
            self.owner.gathered(-tensor_bytes(self.bwd_full))
            self.bwd_full = None


class _UnitModule(nn.Module):
    """Runs `inner` with its unit's parameters gathered, then frees them."""

    def __init__(self, inner: nn.Module, unit: _Unit):
        super().__init__()
        self.inner, self.unit_shard = inner, unit.shard
        self._unit = [unit]

    def forward(self, *args):
        unit, owner = self._unit[0], self._unit[0].owner
        if unit.numel == 0:
            return self.inner(*args)
        full = _Gather.apply(unit.shard, unit)
        key = full.untyped_storage().data_ptr()
        owner.live[key] = unit
        unit.install(full)
        try:
            with torch.autograd.graph.saved_tensors_hooks(owner.pack, owner.unpack):
                out = self.inner(*args)
            if isinstance(out, torch.Tensor) and out.requires_grad:
                # pre-backward: gather again before this unit's backward (seeds 000/001), even
                # where autograd would not need the weights (the first layer's input grad)
                out.register_hook(lambda g: unit.prefetch_backward())
            return out
        finally:
            unit.uninstall()
            del owner.live[key]
            owner.gathered(-tensor_bytes(full))


class Zero3(Strategy):
    name = "zero3"

    def __init__(self, model, group=None, tracer=None, **kw):
        super().__init__(model, group, tracer, **kw)
        self.live: dict[int, _Unit] = {}
        self.gathered_now = self.gathered_peak = 0
        self.saved_counter = None
        blocks = layer_list(model)
        in_blocks = set()
        self.units: list[_Unit] = []
        for i, blk in enumerate(blocks or []):
            u = _Unit(self, i, self._entries(blk, f"{self._prefix(model, blk)}"))
            in_blocks.update(id(m) for m in blk.modules())
            blocks[i] = _UnitModule(blk, u)
            self.units.append(u)
        root_entries = [(m, k, f"{mn}.{k}".lstrip(".")) for mn, m in model.named_modules()
                        if id(m) not in in_blocks and not isinstance(m, _UnitModule)
                        for k, p in m._parameters.items() if p is not None]
        self.root = _Unit(self, len(self.units), root_entries)
        self.units.append(self.root)
        self.model = _UnitModule(model, self.root)
        self.fp32_master = self.dtype == torch.float32
        self.master = [u.shard if self.fp32_master else u.shard.detach().float()
                       for u in self.units]
        self.opt = FlatOptimizer(self.master, self.lr, self.optimizer)
        self.grad32 = [torch.zeros_like(m) for m in self.master] if self.fp32_grads else None
        self.padding = sum(u.padded - u.numel for u in self.units)

    @staticmethod
    def _prefix(model, blk) -> str:
        return next(n for n, m in model.named_modules() if m is blk)

    @staticmethod
    def _entries(blk, prefix):
        return [(m, k, f"{prefix}.{mn}.{k}".replace("..", "."))
                for mn, m in blk.named_modules() for k, p in m._parameters.items()
                if p is not None]

    def gathered(self, delta: int) -> None:
        self.gathered_now += delta
        self.gathered_peak = max(self.gathered_peak, self.gathered_now)

    def pack(self, t):
        unit = self.live.get(t.untyped_storage().data_ptr())
        if unit is None:
            if self.saved_counter is not None:
                self.saved_counter.count(t)
            return t
        return (unit, t.storage_offset(), t.shape, t.stride())

    @staticmethod
    def unpack(packed):
        if isinstance(packed, torch.Tensor):
            return packed
        unit, offset, shape, stride = packed
        return torch.as_strided(unit.backward_full(), shape, stride, offset)

    def zero_grad(self) -> None:
        for u in self.units:
            u.shard.grad = None
        self.gathered_peak = self.gathered_now

    def step(self) -> None:
        with self.tracer.span("optimizer", cat="compute"):
            grads = [u.shard.grad if u.shard.grad is not None else torch.zeros_like(u.shard)
                     for u in self.units]
            if self.grad32 is not None:
                grads = [g32.copy_(g) for g32, g in zip(self.grad32, grads, strict=True)]
            self.opt.step(grads)
            if not self.fp32_master:
                for u, m in zip(self.units, self.master, strict=True):
                    u.shard.data.copy_(m)

    def full_parameters(self):
        return self._gather(self.master)

    def full_grads(self):
        return self._gather([u.shard.grad if u.shard.grad is not None
                             else torch.zeros_like(u.shard) for u in self.units])

    def _gather(self, shards):
        out = {}
        for u, m in zip(self.units, shards, strict=True):
            full = torch.empty(u.padded, dtype=torch.float32, device=u.device)
            dist.all_gather_into_tensor(full, m.detach().float().contiguous(), group=self.group)
            off = 0
            for (_, _, name), shape in zip(u.entries, u.shapes, strict=True):
                out[name] = full[off:off + shape.numel()].view(shape).clone()
                off += shape.numel()
        return {n: out[n] for n in self.names}

    def state_bytes(self):
        optim = self.opt.state_bytes() + sum(tensor_bytes(g) for g in self.grad32 or [])
        if not self.fp32_master:
            optim += sum(tensor_bytes(m) for m in self.master)
        return {"params": sum(tensor_bytes(u.shard) for u in self.units),
                "grads": sum(tensor_bytes(u.shard.grad) for u in self.units),
                "optimizer": optim, "gathered": self.gathered_now,
                "gathered_peak": self.gathered_peak}

    def layout(self):
        return {**super().layout(), "units": [u.numel for u in self.units],
                "unit_padded": [u.padded for u in self.units],
                "shard_elems": sum(u.shard_numel for u in self.units)}
