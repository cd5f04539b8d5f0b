"""Megatron tensor parallelism (+ sequence parallelism) on a finished GPT, reference engine.

Each block becomes
    attn:  f -> q, k, v column-parallel (heads split) -> attention -> proj row-parallel -> g
    mlp:   f -> fc1 column-parallel -> GELU -> fc2 row-parallel -> g
so a block costs two all-reduces forward (the g's) and two backward (the f's), each of
b*s*h elements. With sequence parallelism (Korthikanti et al. 2022) the residual stream,
LayerNorms and biases after the row-parallel linears work on a seq shard: f becomes an all-gather
(reduce-scatter backward), g a reduce-scatter (all-gather backward); the embedding output is
split along seq and gathered again before the LM head. Parameters that then see only part of the
sequence (LayerNorms, row-parallel biases) carry `_sequence_parallel = True`; their gradients are
all-reduced over the TP group by `allreduce_sequence_parallel_grads` after backward.

The native engine (`apply_native_tensor_parallel`) maps the same plan onto DTensor
`parallelize_module` with ColwiseParallel / RowwiseParallel / SequenceParallel.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from jobs.models.moe import MoE
from jobs.parallel import tp_comm


class ColumnParallelLinear(nn.Module):
    """Output features split: this rank keeps rows [r*o/t, (r+1)*o/t) of W and b. No comm."""

    def __init__(self, linear: nn.Linear, rank: int, size: int):
        super().__init__()
        self.weight = nn.Parameter(linear.weight.detach().chunk(size, 0)[rank].clone())
        self.bias = None if linear.bias is None else \
            nn.Parameter(linear.bias.detach().chunk(size, 0)[rank].clone())

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """Input features split; partial outputs summed by g (or reduce-scattered with SP)."""

    def __init__(self, linear: nn.Linear, group, tracer, sequence_parallel: bool):
        super().__init__()
        rank, size = dist.get_rank(group), dist.get_world_size(group)
        self.group, self.tracer, self.sp = group, tracer, sequence_parallel
        self.weight = nn.Parameter(linear.weight.detach().chunk(size, 1)[rank].clone())
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone())
        if self.bias is not None and sequence_parallel:
            self.bias._sequence_parallel = True

    def forward(self, x):
        y = F.linear(x, self.weight)
        if self.sp:
            y = tp_comm.reduce_scatter_to_sequence_parallel_region(y, self.group, self.tracer)
        else:
            y = tp_comm.reduce_from_tensor_model_parallel_region(y, self.group, self.tracer)
        return y if self.bias is None else y + self.bias


class TPRegion(nn.Module):
    """Entry of a tensor-parallel region: f (or the SP all-gather), then the wrapped module."""

    def __init__(self, inner: nn.Module, group, tracer, sequence_parallel: bool):
        super().__init__()
        self.inner, self.group, self.tracer, self.sp = inner, group, tracer, sequence_parallel

    def forward(self, x):
        if self.sp:
            x = tp_comm.gather_from_sequence_parallel_region(x, self.group, self.tracer)
        else:
            x = tp_comm.copy_to_tensor_model_parallel_region(x, self.group, self.tracer)
        return self.inner(x)


class SPScatter(nn.Module):
    def __init__(self, group, tracer):
        super().__init__()
        self.group, self.tracer = group, tracer

    def forward(self, x):
        return tp_comm.scatter_to_sequence_parallel_region(x, self.group, self.tracer)


class SPGather(nn.Module):
    """Gather the seq shards before the head: its output gradient is full on every rank when
    the head is replicated (backward: split), partial when it is vocab-parallel (reduce-scatter)."""

    def __init__(self, group, tracer, output_grad_is_partial: bool = False):
        super().__init__()
        self.group, self.tracer, self.partial = group, tracer, output_grad_is_partial

    def forward(self, x):
        return tp_comm.gather_from_sequence_parallel_region(x, self.group, self.tracer,
                                                            output_grad_is_partial=self.partial)


def _mark_sp(module: nn.Module) -> None:
    for p in module.parameters():
        p._sequence_parallel = True


def apply_tensor_parallel(model: nn.Module, group, *, tracer=None,
                          sequence_parallel: bool = False) -> nn.Module:
    """Shard a GPT (or a pipeline stage holding some of its parts) in place over `group`."""
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    blocks = getattr(model, "blocks", None)
    if blocks is None:
        raise NotImplementedError("tensor parallelism is implemented for arch 'gpt' only")
    for blk in blocks:
        attn, mlp = blk.attn, blk.mlp
        for name in ("q", "k", "v"):
            setattr(attn, name, ColumnParallelLinear(getattr(attn, name), rank, size))
        attn.proj = RowParallelLinear(attn.proj, group, tracer, sequence_parallel)
        blk.attn = TPRegion(attn, group, tracer, sequence_parallel)
        if isinstance(mlp, MoE):  # seed 004: attention uses TP, the MoE MLP uses EP; it runs
            continue              # whole on every TP rank's (replicated) tokens
        mlp.fc1 = ColumnParallelLinear(mlp.fc1, rank, size)
        mlp.fc2 = RowParallelLinear(mlp.fc2, group, tracer, sequence_parallel)
        blk.mlp = TPRegion(mlp, group, tracer, sequence_parallel)
        if sequence_parallel:
            _mark_sp(blk.ln1)
            _mark_sp(blk.ln2)
    if sequence_parallel:
        if getattr(model, "embed", None) is not None:
            model.embed = nn.Sequential(model.embed, SPScatter(group, tracer))
        if getattr(model, "head", None) is not None:
            _mark_sp(model.head.norm)
            model.head.norm = nn.Sequential(model.head.norm, SPGather(group, tracer))
    return model


def allreduce_sequence_parallel_grads(model: nn.Module, group, tracer=None) -> None:
    """Sum the partial gradients of sequence-sharded replicated parameters over the TP group."""
    params = [p for p in model.parameters()
              if getattr(p, "_sequence_parallel", False) and p.grad is not None]
    if not params or dist.get_world_size(group) == 1:
        return
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    with tp_comm._comm(tracer, "all_reduce", flat, group, flat.numel(), "sp_param_grads",
                       "bwd"):
        dist.all_reduce(flat, group=group)
    off = 0
    for p in params:
        n = p.grad.numel()
        p.grad.copy_(flat[off:off + n].view_as(p.grad))
        off += n


def apply_native_tensor_parallel(model: nn.Module, tp_mesh, *, sequence_parallel: bool = False,
                                 vocab_parallel: bool = False) -> nn.Module:
    """The same plan with DTensor: parallelize_module over a 1-D `tp_mesh`. With
    `vocab_parallel` the head's input is left to `apply_native_vocab_parallel`'s plan."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        PrepareModuleOutput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )
    row_out = Shard(1) if sequence_parallel else Replicate()
    for blk in getattr(model, "blocks", []):
        plan = {"attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(),
                "attn.v": ColwiseParallel(), "attn.proj": RowwiseParallel(output_layouts=row_out),
                "mlp.fc1": ColwiseParallel(), "mlp.fc2": RowwiseParallel(output_layouts=row_out)}
        # The attention / MLP input as one DTensor: q, k and v then share a single backward
        # all-reduce (f) instead of one each (DTensor sums their Partial gradients first).
        src = Shard(1) if sequence_parallel else Replicate()
        to_rep = PrepareModuleInput(input_layouts=(src,), desired_input_layouts=(Replicate(),))
        plan.update({"attn": to_rep, "mlp": to_rep})
        if sequence_parallel:
            plan.update({"ln1": SequenceParallel(), "ln2": SequenceParallel()})
        parallelize_module(blk, tp_mesh, plan)
    if sequence_parallel:
        if getattr(model, "embed", None) is not None:
            parallelize_module(model.embed, tp_mesh, PrepareModuleOutput(
                output_layouts=Replicate(), desired_output_layouts=Shard(1)))
        if getattr(model, "head", None) is not None:
            plan = {"norm": SequenceParallel()}
            if not vocab_parallel:
                plan["out"] = PrepareModuleInput(input_layouts=(Shard(1),),
                                                 desired_input_layouts=(Replicate(),),
                                                 use_local_output=True)
            parallelize_module(model.head, tp_mesh, plan)
    return model
