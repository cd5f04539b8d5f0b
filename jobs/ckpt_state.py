"""A strategy's training state as logical tensors over the dp axis, and back (jobs/ckpt.py).

`dp_state(strategy)` -> (params, moments, step): every parameter the strategy holds, whole over
dp, fp32 (the master copy where there is one), by the strategy's own parameter names; Adam's
moments in the same form, {"exp_avg": {name: t}, "exp_avg_sq": {...}}; Adam's step count (None
on a rank without an optimizer: parameter-server workers). A collective over dp where state is
sharded (reference ZeRO flat shards are all-gathered; DTensors gathered with full_tensor()).
`dp_load(strategy, params, moments, step)` is the inverse: each rank keeps its own shard.
Values are copied, never recomputed, so a round trip is exact.

Tensor parallel shards (reference Megatron layers) stay tp-local here; jobs/ckpt.py joins them.
SGD (no momentum) keeps no state: its moments are empty.
"""

from __future__ import annotations

import torch

from jobs.parallel.base import full_fp32
from jobs.parallel.data import Replicated
from jobs.parallel.native import NativeDDP, NativeFSDP
from jobs.parallel.threed import NativeMP
from jobs.parallel.zero import Zero3, Zero12

MOMENTS = {"adam": ("exp_avg", "exp_avg_sq"), "sgd": ()}


def _refuse(strategy) -> None:
    if isinstance(strategy, NativeDDP) and hasattr(strategy.opt, "optim"):
        raise ValueError("checkpoints of native ZeRO-1 (ZeroRedundancyOptimizer) are not "
                         "supported: each parameter's optimizer state lives on its owner rank "
                         "only (docs/checkpoints.md); use the reference engine's zero1")


# --- flat optimizers (reference engines) --------------------------------------------------------

def _flat_moments(fo, keys) -> dict[str, list[torch.Tensor]]:
    out = {}
    for k in keys:
        out[k] = [fo.opt.state[p][k] if k in fo.opt.state.get(p, {}) else torch.zeros_like(p)
                  for p in fo.params]
    return out


def _flat_step(fo) -> float:
    st = fo.opt.state.get(fo.params[0], {})
    return float(st["step"]) if "step" in st else 0.0


def _set_flat(fo, moments: dict[str, list[torch.Tensor]], step: float) -> None:
    if not moments:
        return
    for i, p in enumerate(fo.params):
        fo.opt.state[p] = {"step": torch.tensor(step, dtype=torch.float32),
                           **{k: lst[i].clone().to(p.device) for k, lst in moments.items()}}


def _fill(full: torch.Tensor, views: list[torch.Tensor], params: list, named_by_id: dict):
    for v, p in zip(views, params, strict=True):
        v.copy_(named_by_id[id(p)])
    return full


def _flat_of(s, named: dict):
    """A flat-buffer strategy's whole fp32 buffer filled from full tensors by name."""
    full = torch.zeros(s.bk.total, dtype=torch.float32, device=s.flat.device)
    by_id = {id(p): named[n] for n, p in s.model.named_parameters()}
    return _fill(full, s.bk.views(full), s.bk.params, by_id)


def _gathered_state(s, keys):
    """(full params, full moments, step) of a strategy holding fp32 master / optimizer shards
    (reference ZeRO 1-3): every shard gathered."""
    mom = {k: s._gather(v) for k, v in _flat_moments(s.opt, keys).items()}
    return s._gather(s.master), mom, _flat_step(s.opt)


class _ReplicatedIO:
    def __init__(self, s: Replicated):
        self.s = s

    def to_named(self, flat):
        return self.s._by_name(flat)

    def from_named(self, named):
        return _flat_of(self.s, named)

    def state(self, keys):
        s = self.s
        params = self.to_named(s.master if s.master is not None else s.flat.float())
        if s.opt is None:
            return params, {}, None
        mom = {k: self.to_named(v[0]) for k, v in _flat_moments(s.opt, keys).items()}
        return params, mom, _flat_step(s.opt)

    def load(self, params, moments, step):
        s = self.s
        full = self.from_named(params)
        s.flat.copy_(full.to(s.flat.dtype))
        if s.master is not None and s.master is not s.flat:
            s.master.copy_(full)
        if s.opt is not None:
            _set_flat(s.opt, {k: [self.from_named(v)] for k, v in moments.items()}, step)


class _Zero12IO:
    def __init__(self, s: Zero12):
        self.s = s

    def full_flat(self, named):
        return _flat_of(self.s, named)

    def shards(self, full):
        return [self.s.bk.shard(full, b, self.s.r).clone() for b in range(len(self.s.bk.groups))]

    def state(self, keys):
        return _gathered_state(self.s, keys)

    def load(self, params, moments, step):
        s = self.s
        full = self.full_flat(params)
        s.flat.copy_(full.to(s.flat.dtype))  # ZeRO-1/2 hold every parameter
        if not s.fp32_master:
            for m, sh in zip(s.master, self.shards(full), strict=True):
                m.copy_(sh)
        _set_flat(s.opt, {k: self.shards(self.full_flat(v)) for k, v in moments.items()}, step)


class _Zero3IO:
    def __init__(self, s: Zero3):
        self.s = s

    def shards(self, named):
        s, out = self.s, []
        for u in s.units:
            flat = torch.zeros(u.padded, dtype=torch.float32, device=u.device)
            off = 0
            for (_, _, name), shape in zip(u.entries, u.shapes, strict=True):
                flat[off:off + shape.numel()].copy_(named[name].reshape(-1))
                off += shape.numel()
            out.append(flat[s.r * u.shard_numel:(s.r + 1) * u.shard_numel].clone())
        return out

    def state(self, keys):
        return _gathered_state(self.s, keys)

    def load(self, params, moments, step):
        s = self.s
        for u, m, sh in zip(s.units, s.master, self.shards(params), strict=True):
            u.shard.data.copy_(sh.to(u.shard.dtype))
            if not s.fp32_master:
                m.copy_(sh)
        _set_flat(s.opt, {k: self.shards(v) for k, v in moments.items()}, step)


# --- torch optimizers over (DTensor) parameters (native engine) ---------------------------------

def _local_copy(dst: torch.Tensor, full: torch.Tensor) -> torch.Tensor:
    """`full` (a whole tensor, the same on every rank) into `dst`'s own shard, in place."""
    with torch.no_grad():
        if hasattr(dst, "device_mesh"):
            from torch.distributed.tensor import distribute_tensor
            d = distribute_tensor(full.to(dst.dtype).to(dst.device), dst.device_mesh,
                                  dst.placements, src_data_rank=None)  # local slice, no comm
            dst._local_tensor.copy_(d._local_tensor)
        else:
            dst.copy_(full)
    return dst


class _TorchOptIO:
    def __init__(self, s):
        self.s = s
        module = s.ddp.module if isinstance(s, NativeDDP) else s.model
        self.named = list(module.named_parameters())

    def state(self, keys):
        opt = self.s.opt
        params = {n: full_fp32(p) for n, p in self.named}
        mom = {k: {n: full_fp32(opt.state[p][k]) if k in opt.state.get(p, {}) else
                   torch.zeros_like(params[n]) for n, p in self.named} for k in keys}
        st = opt.state.get(self.named[0][1], {})
        return params, mom, float(st["step"]) if "step" in st else 0.0

    def load(self, params, moments, step):
        opt = self.s.opt
        for n, p in self.named:
            _local_copy(p, params[n])
            if moments:
                opt.state[p] = {"step": torch.tensor(step, dtype=torch.float32),
                                **{k: _local_copy(torch.zeros_like(p, dtype=torch.float32),
                                                  v[n]) for k, v in moments.items()}}


def _io(strategy):
    _refuse(strategy)
    for cls, io in ((Replicated, _ReplicatedIO), (Zero12, _Zero12IO), (Zero3, _Zero3IO),
                    (NativeDDP, _TorchOptIO), (NativeFSDP, _TorchOptIO),
                    (NativeMP, _TorchOptIO)):
        if isinstance(strategy, cls):
            return io(strategy)
    raise ValueError(f"checkpoints are not supported for strategy {type(strategy).__name__}")


def supported(strategy) -> None:
    """ValueError when `strategy` cannot be checkpointed (the reason in the message)."""
    _io(strategy)


def dp_state(strategy, optimizer: str):
    return _io(strategy).state(MOMENTS[optimizer])


def dp_load(strategy, params: dict, moments: dict, step: float) -> None:
    _io(strategy).load(params, moments, step)
