"""Megatron's vocabulary-parallel embedding, LM head and cross-entropy (reference engine).

With tp = t each rank holds V/t rows of the token embedding and V/t columns of the LM head:
    embedding  partial lookup (ids outside the shard give zeros), then g: all-reduce forward
               (b*s*h), identity backward;
    head       f (identity forward, all-reduce of b*s*h backward; with sequence parallelism the
               all-gather before the head, whose backward is then a reduce-scatter), then a
               column-parallel linear giving logits for this rank's V/t words;
    loss       cross-entropy on vocab-sharded logits: three all-reduces of b*s elements forward
               (max, the target's logit, the sum of exponentials), none backward.
Enabled by `parallel.vocab_parallel` when the spec has it (read with getattr in
model_parallel.py); not wired for the native engine.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from jobs.parallel import tp_comm
from jobs.parallel.tensor import ColumnParallelLinear, SPGather, TPRegion


class VocabParallelEmbedding(nn.Module):
    def __init__(self, emb: nn.Embedding, group, tracer):
        super().__init__()
        rank, size = dist.get_rank(group), dist.get_world_size(group)
        v = emb.num_embeddings
        if v % size:
            raise ValueError(f"vocab {v} must be divisible by tp = {size}")
        self.start, self.n = rank * (v // size), v // size
        self.weight = nn.Parameter(emb.weight.detach()[self.start:self.start + self.n].clone())
        self.group, self.tracer = group, tracer

    def forward(self, ids):
        out_of_shard = (ids < self.start) | (ids >= self.start + self.n)
        local = (ids - self.start).masked_fill(out_of_shard, 0)
        y = F.embedding(local, self.weight).masked_fill(out_of_shard.unsqueeze(-1), 0.0)
        return tp_comm.reduce_from_tensor_model_parallel_region(y, self.group, self.tracer)


def _all_reduce(t, group, tracer, op=dist.ReduceOp.SUM):
    with tp_comm._comm(tracer, "all_reduce", t, group, t.numel(), "vocab_ce", "fwd"):
        dist.all_reduce(t, op=op, group=group)
    return t


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, group, tracer, start):
        logits = logits.float()
        lmax = _all_reduce(logits.max(dim=-1).values, group, tracer, dist.ReduceOp.MAX)
        logits = logits - lmax.unsqueeze(-1)
        n = logits.shape[-1]
        out_of_shard = (target < start) | (target >= start + n)
        local = (target - start).masked_fill(out_of_shard, 0)
        picked = logits.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(out_of_shard, 0)
        picked = _all_reduce(picked.contiguous(), group, tracer)
        exp = logits.exp()
        sum_exp = _all_reduce(exp.sum(dim=-1), group, tracer)
        ctx.save_for_backward(exp / sum_exp.unsqueeze(-1), out_of_shard, local)
        return torch.log(sum_exp) - picked

    @staticmethod
    def backward(ctx, g):
        softmax, out_of_shard, local = ctx.saved_tensors
        grad = softmax.clone()
        onehot = F.one_hot(local, grad.shape[-1]).to(grad.dtype)
        grad -= onehot * (~out_of_shard).unsqueeze(-1).to(grad.dtype)
        return grad * g.unsqueeze(-1), None, None, None, None


def vocab_parallel_loss(group, tracer, start: int):
    """loss_fn(local_logits, targets): mean cross-entropy over tokens, vocab-sharded logits."""
    def loss_fn(logits, target):
        return _VocabParallelCrossEntropy.apply(logits, target, group, tracer, start).mean()
    return loss_fn


def apply_vocab_parallel(model: nn.Module, group, *, tracer=None,
                         sequence_parallel: bool = False) -> int | None:
    """Shard a (tensor-parallel) GPT's token embedding and LM head over the vocabulary, in
    place; returns this rank's first word id (for `vocab_parallel_loss`) when it has the head."""
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    embed, head = getattr(model, "embed", None), getattr(model, "head", None)
    if embed is not None:
        inner = embed[0] if isinstance(embed, nn.Sequential) else embed  # SP wraps it
        inner.tok = VocabParallelEmbedding(inner.tok, group, tracer)
    start = None
    if head is not None:
        vocab = head.out.weight.shape[0]
        start = rank * (vocab // size)
        col = ColumnParallelLinear(head.out, rank, size)
        if sequence_parallel:  # the gather before the head now gets partial gradients
            norm = head.norm[0] if isinstance(head.norm, nn.Sequential) else head.norm
            head.norm = nn.Sequential(norm, SPGather(group, tracer, output_grad_is_partial=True))
            head.out = col
        else:
            head.out = TPRegion(col, group, tracer, False)
    return start


def apply_native_vocab_parallel(model: nn.Module, tp_mesh, *,
                                sequence_parallel: bool = False) -> bool:
    """The same sharding with DTensor, after `apply_native_tensor_parallel`: the token embedding
    row-wise over the vocabulary (DTensor masks the other shards' ids and all-reduces the
    partial lookup, b*s*h), the LM head column-wise with logits left sharded on the vocabulary
    (Shard(-1)), for `native_vocab_parallel_loss` under `loss_parallel()`. Returns whether this
    module holds the head."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )
    embed, head = getattr(model, "embed", None), getattr(model, "head", None)
    if embed is not None:
        inner = embed[0] if isinstance(embed, nn.Sequential) else embed
        parallelize_module(inner.tok, tp_mesh, RowwiseParallel(input_layouts=Replicate(),
                                                               output_layouts=Replicate()))
    if head is None:
        return False
    # With SP the head's input is sequence-sharded: the column-parallel head all-gathers it
    # (reduce-scatter backward) instead of PrepareModuleInput's gather to a local tensor.
    parallelize_module(head, tp_mesh, {"out": ColwiseParallel(
        input_layouts=Shard(1) if sequence_parallel else Replicate(),
        output_layouts=Shard(-1), use_local_output=False)})
    return True


def native_vocab_parallel_loss(loss_fn):
    """loss_fn on vocab-sharded DTensor logits: run under `torch.distributed.tensor.parallel.
    loss_parallel()` (forward and backward), it all-reduces max, target logit and sum of
    exponentials over tp instead of gathering the logits. The loss comes back as a plain
    (replicated) tensor so the pipeline runtimes treat it as any other."""
    def wrapped(logits, target):
        out = loss_fn(logits, target)
        return out.to_local() if hasattr(out, "to_local") else out
    return wrapped
