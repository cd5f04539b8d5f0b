"""Megatron's conjugate communication operators (Shoeybi et al. 2019, sections 3; Korthikanti et
al. 2022 for sequence parallelism), as autograd functions on an explicit process group.

    f  copy_to_tensor_model_parallel_region       forward identity    backward all-reduce
    g  reduce_from_tensor_model_parallel_region   forward all-reduce  backward identity
    g' gather_from_sequence_parallel_region       forward all-gather  backward reduce-scatter
    f' reduce_scatter_to_sequence_parallel_region forward reduce-scatter  backward all-gather
       scatter_to_sequence_parallel_region        forward split       backward all-gather

Every collective is recorded on the tracer with `axis="tp"` and the nccl-tests logical payload S
(all-reduce: the tensor; all-gather: the gathered output; reduce-scatter: the unsharded input),
plus `phase` ("fwd" / "bwd") and `region` (which operator issued it).
Sequence-parallel tensors are (batch, seq, hidden) and are split along dim 1 (seq).
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

from jobs.parallel.checkpoint import recomputing

SEQ_DIM = 1


def _comm(tracer, op, t: torch.Tensor, group, payload_elems: int, region: str, phase: str):
    if tracer is None:
        return contextlib.nullcontext()
    n = dist.get_world_size(group)
    extra = {"recompute": True} if recomputing() else {}  # activation checkpointing
    return tracer.comm(op, payload_bytes=payload_elems * t.element_size(), group_size=n,
                       axis="tp", group="tp", region=region, phase=phase,
                       dtype=str(t.dtype).removeprefix("torch."), **extra)


def _all_reduce(x, group, tracer, region, phase):
    x = x.contiguous()
    with _comm(tracer, "all_reduce", x, group, x.numel(), region, phase):
        dist.all_reduce(x, group=group)
    return x


def _all_gather(x, group, tracer, region, phase):
    n = dist.get_world_size(group)
    xt = x.movedim(SEQ_DIM, 0).contiguous()
    out = torch.empty((n * xt.shape[0], *xt.shape[1:]), dtype=x.dtype, device=x.device)
    with _comm(tracer, "all_gather", x, group, out.numel(), region, phase):
        dist.all_gather_into_tensor(out, xt, group=group)
    return out.movedim(0, SEQ_DIM).contiguous()


def _reduce_scatter(x, group, tracer, region, phase):
    n = dist.get_world_size(group)
    xt = x.movedim(SEQ_DIM, 0).contiguous()
    out = torch.empty((xt.shape[0] // n, *xt.shape[1:]), dtype=x.dtype, device=x.device)
    with _comm(tracer, "reduce_scatter", x, group, xt.numel(), region, phase):
        dist.reduce_scatter_tensor(out, xt, group=group)
    return out.movedim(0, SEQ_DIM).contiguous()


def _split(x, group):
    n, r = dist.get_world_size(group), dist.get_rank(group)
    return x.chunk(n, dim=SEQ_DIM)[r].contiguous()


class _CopyToRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, tracer):
        ctx.group, ctx.tracer = group, tracer
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return _all_reduce(g.clone(), ctx.group, ctx.tracer, "f", "bwd"), None, None


class _ReduceFromRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, tracer):
        return _all_reduce(x.clone(), group, tracer, "g", "fwd")

    @staticmethod
    def backward(ctx, g):
        return g, None, None


class _GatherFromSP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, tracer, output_grad_is_partial):
        ctx.group, ctx.tracer, ctx.partial = group, tracer, output_grad_is_partial
        return _all_gather(x, group, tracer, "sp_gather", "fwd")

    @staticmethod
    def backward(ctx, g):
        if ctx.partial:
            return _reduce_scatter(g, ctx.group, ctx.tracer, "sp_gather", "bwd"), None, None, None
        return _split(g, ctx.group), None, None, None


class _ReduceScatterToSP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, tracer):
        ctx.group, ctx.tracer = group, tracer
        return _reduce_scatter(x, group, tracer, "sp_reduce_scatter", "fwd")

    @staticmethod
    def backward(ctx, g):
        return _all_gather(g, ctx.group, ctx.tracer, "sp_reduce_scatter", "bwd"), None, None


class _ScatterToSP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, tracer):
        ctx.group, ctx.tracer = group, tracer
        return _split(x, group)

    @staticmethod
    def backward(ctx, g):
        return _all_gather(g, ctx.group, ctx.tracer, "sp_scatter", "bwd"), None, None


def copy_to_tensor_model_parallel_region(x, group, tracer=None):
    """f: identity forward, all-reduce backward."""
    return _CopyToRegion.apply(x, group, tracer)


def reduce_from_tensor_model_parallel_region(x, group, tracer=None):
    """g: all-reduce forward, identity backward."""
    return _ReduceFromRegion.apply(x, group, tracer)


def gather_from_sequence_parallel_region(x, group, tracer=None, output_grad_is_partial=True):
    """All-gather along seq forward; backward reduce-scatter (or split when every rank already
    holds the full, identical output gradient)."""
    return _GatherFromSP.apply(x, group, tracer, output_grad_is_partial)


def reduce_scatter_to_sequence_parallel_region(x, group, tracer=None):
    """Reduce-scatter along seq forward, all-gather backward."""
    return _ReduceScatterToSP.apply(x, group, tracer)


def scatter_to_sequence_parallel_region(x, group, tracer=None):
    """Keep this rank's seq chunk forward, all-gather backward."""
    return _ScatterToSP.apply(x, group, tracer)
