"""3D composition on the native engine: DTensor TP over mesh["tp"] (jobs/parallel/tensor.py),
torch.distributed.pipelining over the pp axis (pipeline/native.py) and FSDP2 `fully_shard` over
mesh["dp"], whose parameters are then 2-D DTensors (dp x tp), with torch.optim.Adam (or SGD).

DistributedDataParallel cannot wrap DTensor parameters, so on the native engine the dp axis is
FSDP2 whatever the ZeRO stage: zero_stage 3 reshards after forward (ZeRO-3), 0-2 keep the
parameters gathered between forward and backward (ZeRO-2-like traffic). FSDP2's collectives are
issued from Python and recorded by jobs/parallel/capture.py (axis "dp"); DTensor's TP
collectives go through functional collectives, below Python's torch.distributed: a dispatch
mode (`FuncolRecorder`) records them on step 0 only (it slows every op; later steps issue the
same collectives).
The reference engine composes with the DP / ZeRO strategies of jobs/train.py instead.
"""

from __future__ import annotations

import contextlib

import torch

from jobs.models import layer_list
from jobs.parallel.base import Strategy, tensor_bytes
from jobs.parallel.checkpoint import recomputing
from jobs.parallel.native import undo_dp_average
from jobs.parallel.optim import make_optimizer


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


class NativeMP(Strategy):
    engine = "native"

    def __init__(self, model, stages: dict, ctx, **kw):
        dims = ctx.dims
        group = ctx.mesh["dp"].get_group() if dims.dp > 1 else None
        super().__init__(model, group, ctx.tracer, **kw)
        self.name = "native-mp"
        self.tp, self.pp = dims.tp > 1, dims.pp
        if dims.dp > 1:
            from torch.distributed.fsdp import fully_shard
            reshard = ctx.spec.parallel.zero_stage == 3
            for st in stages.values():
                for blk in layer_list(st) or []:
                    fully_shard(blk, mesh=ctx.mesh["dp"], reshard_after_forward=reshard)
                fully_shard(st, mesh=ctx.mesh["dp"], reshard_after_forward=reshard)
            self.notes.append(f"dp axis: FSDP2 (reshard_after_forward={reshard})")
        self.opt = make_optimizer(model.parameters(), self.optimizer, self.lr)

    @contextlib.contextmanager
    def comm_context(self):
        with contextlib.ExitStack() as stack:
            if self.group is not None:
                # only the dp group: the pipeline's own p2p are traced by pipeline/native.py
                from jobs.parallel.capture import capture
                stack.enter_context(capture(self.tracer, {self.group: "dp"}, only_named=True))
            if self.tp and self.tracer.step == 0:  # a Python dispatch mode slows every op:
                stack.enter_context(FuncolRecorder(self.tracer, "tp"))  # step 0 only
            yield

    def finish_grads(self) -> None:
        if self.group is not None:
            undo_dp_average(self.model, self.n)

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
                "grads": sum(tensor_bytes(_local(p.grad)) for p in ps), "optimizer": optim}


class FuncolRecorder:
    """Record DTensor's functional collectives (issued below Python's torch.distributed, so
    capture.py cannot see them) as comm records on `axis`: a dispatch mode active for the step.
    Payload S follows nccl-tests: all-reduce input, all-gather output, reduce-scatter input."""

    def __init__(self, tracer, axis: str = "tp"):
        from torch.distributed.tensor import DTensor
        from torch.utils._python_dispatch import TorchDispatchMode

        rec = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if any(t is DTensor for t in types):
                    return NotImplemented  # let DTensor desugar into its collectives first
                rec._see(func, args)
                return func(*args, **(kwargs or {}))

        self.tracer, self.axis, self.mode = tracer, axis, _Mode()

    def _see(self, func, args) -> None:
        name = getattr(func, "__name__", "").split(".")[0]
        if "_c10d_functional" not in str(func) or name not in (
                "all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor"):
            return
        from torch.distributed.distributed_c10d import _resolve_process_group
        t = args[0]
        n = _resolve_process_group(args[-1]).size()
        nbytes = t.numel() * t.element_size()
        op = {"all_reduce": "all_reduce", "all_gather_into_tensor": "all_gather",
              "reduce_scatter_tensor": "reduce_scatter"}[name]
        payload = nbytes * n if op == "all_gather" else nbytes
        phase = "bwd" if torch._C._current_autograd_node() is not None else "fwd"
        extra = {"recompute": True} if recomputing() else {}  # activation checkpointing
        self.tracer.comm_start(op, payload_bytes=payload, group_size=n, axis=self.axis,
                               group=self.axis, phase=phase, source="dtensor", **extra).done()

    def __enter__(self):
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        return self.mode.__exit__(*exc)
