"""3D composition on the native engine: DTensor TP over mesh["tp"] (jobs/parallel/tensor.py),
torch.distributed.pipelining over the pp axis (pipeline/native.py) and FSDP2 `fully_shard` over
mesh["dp"], whose parameters are then 2-D DTensors (dp x tp), with torch.optim.Adam.

DistributedDataParallel cannot wrap DTensor parameters, so on the native engine the dp axis is
FSDP2 whatever the ZeRO stage: zero_stage 3 reshards after forward (ZeRO-3), 0-2 keep the
parameters gathered between forward and backward (ZeRO-2-like traffic). FSDP2's collectives are
issued from Python and recorded by jobs/parallel/capture.py (axis "dp"); DTensor's TP
collectives go through functional collectives and are counted per step with CommDebugMode
instead (the summary's `native_tp_comm_counts`).
The reference engine composes with the DP / ZeRO strategies of jobs/train.py instead.
"""

from __future__ import annotations

import contextlib

import torch

from jobs.models import layer_list
from jobs.parallel.base import Strategy, tensor_bytes


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


class NativeMP(Strategy):
    engine = "native"

    def __init__(self, model, stages: dict, ctx, **kw):
        dims = ctx.dims
        group = ctx.mesh["dp"].get_group() if dims.dp > 1 else None
        super().__init__(model, group, ctx.tracer, **kw)
        self.name = "native-mp"
        if dims.dp > 1:
            from torch.distributed.fsdp import fully_shard
            reshard = ctx.spec.parallel.zero_stage == 3
            for st in stages.values():
                for blk in layer_list(st) or []:
                    fully_shard(blk, mesh=ctx.mesh["dp"], reshard_after_forward=reshard)
                fully_shard(st, mesh=ctx.mesh["dp"], reshard_after_forward=reshard)
            self.notes.append(f"dp axis: FSDP2 (reshard_after_forward={reshard})")
        self.opt = torch.optim.Adam(model.parameters(), lr=self.lr)

    def comm_context(self):
        if self.group is None:
            return contextlib.nullcontext()
        from jobs.parallel.capture import capture
        return capture(self.tracer, {self.group: "dp"})

    def step(self) -> None:
        with self.tracer.span("optimizer", cat="compute"):
            self.opt.step()

    def zero_grad(self) -> None:
        self.opt.zero_grad(set_to_none=True)

    def full_parameters(self):
        return {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().float()
                for n, p in self.model.named_parameters()}

    def state_bytes(self):
        ps = list(self.model.parameters())
        optim = sum(tensor_bytes(_local(t)) for s in self.opt.state.values() for t in s.values()
                    if torch.is_tensor(t) and t.numel() > 1)
        return {"params": sum(tensor_bytes(_local(p)) for p in ps),
                "grads": sum(tensor_bytes(_local(p.grad)) for p in ps), "optim": optim}
