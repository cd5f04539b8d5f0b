"""Context parallelism, reference engine: ring attention with the load-balanced causal split
(seed 004: "for long sequences, split the activations across GPUs"; Liu et al. 2023, the
head + tail layout of Megatron-Core CP / torchtitan).

Groups, carved out of the DP group like EP's: `cp` consecutive DP ranks (dp_idx // cp equal)
share one slice of the global batch and split its sequences; the dp / cp such groups are the
data replicas. The sequence is cut into 2·cp chunks of c = seq_len / (2·cp) tokens and CP rank
i holds chunks i and 2·cp − 1 − i (`cp_positions`), so every rank gets the same amount of
causal work. jobs/data.py slices the tokens and targets, `CPEmbedding` adds the positions of
those chunks, `RingAttention` replaces each block's attention (same parameters, same names).

Ring attention per block: Q stays, K and V go round the ring (jobs/parallel/cp_comm.py): at ring
step t rank i holds the K / V of rank (i − t) mod cp, posts the next transfer, then attends its
two query chunks to the two key chunks, each pair full (query chunk after key chunk), causal
(the same chunk: the diagonal) or skipped (query chunk before key chunk), and merges the block
into its output by log-sum-exp (online softmax). Backward (`_RingAttn.backward`) runs the ring
again: K / V travel as in forward, each rank adds its queries' dK / dV to the accumulator of
the K / V it holds and passes the accumulator on; after cp passes every accumulator is home.

Gradients: every rank's loss is the mean over its local tokens (equal counts), the global loss
the mean over all DP ranks' losses, and the ring backward brings each rank the gradient of
every rank's loss with respect to its K / V; so the DP strategy's average over the full DP
group (dp ranks, CP included) is the single-process gradient, unchanged."""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from jobs.parallel.base import own_group
from jobs.parallel.cp_comm import Ring
from jobs.testbug import injected

FULL, CAUSAL, SKIP = "full", "causal", "skip"


def cp_positions(seq_len: int, cp: int, cp_rank: int) -> torch.Tensor:
    """Global positions of CP rank `cp_rank`'s tokens: chunk i then chunk 2·cp − 1 − i."""
    c = seq_len // (2 * cp)
    assert c * 2 * cp == seq_len, (seq_len, cp)
    head, tail = chunk_ids(cp, cp_rank)
    return torch.cat([torch.arange(head * c, (head + 1) * c),
                      torch.arange(tail * c, (tail + 1) * c)])


def chunk_ids(cp: int, cp_rank: int) -> tuple[int, int]:
    """The (head, tail) chunk indices of CP rank `cp_rank`."""
    return cp_rank, 2 * cp - 1 - cp_rank


def pair_kind(q_chunk: int, k_chunk: int) -> str:
    if q_chunk > k_chunk:
        return FULL
    return CAUSAL if q_chunk == k_chunk else SKIP


def _scores(q, k, kind, scale):
    s = (q @ k.transpose(-2, -1)) * scale
    if kind == CAUSAL and not injected("cp_drop_causal_mask"):
        n = s.shape[-1]
        mask = torch.ones(n, n, dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~mask, float("-inf"))
    return s


def _pairs(ring: Ring, src: int):
    qc, kc = chunk_ids(ring.cp, ring.index), chunk_ids(ring.cp, src)
    for i in range(2):
        for j in range(2):
            kind = pair_kind(qc[i], kc[j])
            if kind != SKIP:
                yield i, j, kind


class _RingAttn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, ring: Ring, layer: int):
        scale = 1.0 / math.sqrt(q.shape[-1])
        tr, cp = ring.tracer, ring.cp
        qs = q.chunk(2, dim=2)
        outs = [torch.zeros_like(x) for x in qs]
        lses = [torch.full(x.shape[:-1], float("-inf"), dtype=x.dtype, device=x.device)
                for x in qs]
        kv = {"k": k, "v": v}
        for t in range(cp):
            src = (ring.index - t) % cp
            nxt = ring.start(kv, cp_step=t, phase="fwd", layer=layer) if t < cp - 1 else None
            pairs = list(_pairs(ring, src))
            with tr.span("cp.step", cat="compute", cp_step=t, phase="fwd", layer=layer,
                         src=src, blocks=len(pairs)):
                ks, vs = kv["k"].chunk(2, dim=2), kv["v"].chunk(2, dim=2)
                for i, j, kind in pairs:
                    s = _scores(qs[i], ks[j], kind, scale)
                    lse_b = torch.logsumexp(s, dim=-1)
                    o_b = torch.exp(s - lse_b.unsqueeze(-1)) @ vs[j]
                    new = torch.logaddexp(lses[i], lse_b)
                    outs[i] = (outs[i] * torch.exp(lses[i] - new).unsqueeze(-1)
                               + o_b * torch.exp(lse_b - new).unsqueeze(-1))
                    lses[i] = new
            if nxt is not None:
                kv = ring.wait(nxt)
        out, lse = torch.cat(outs, dim=2), torch.cat(lses, dim=2)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ring, ctx.layer = ring, layer
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        ring, layer = ctx.ring, ctx.layer
        tr, cp = ring.tracer, ring.cp
        scale = 1.0 / math.sqrt(q.shape[-1])
        dout = dout.contiguous()
        delta = (dout * out).sum(-1)  # D = rowsum(dO * O)
        qs, dos = q.chunk(2, dim=2), dout.chunk(2, dim=2)
        lses, deltas = lse.chunk(2, dim=2), delta.chunk(2, dim=2)
        dqs = [torch.zeros_like(x) for x in qs]
        kv, acc = {"k": k, "v": v}, None
        for t in range(cp):
            src = (ring.index - t) % cp
            nxt = ring.start(kv, cp_step=t, phase="bwd", layer=layer) if t < cp - 1 else None
            pairs = list(_pairs(ring, src))
            with tr.span("cp.step", cat="compute", cp_step=t, phase="bwd", layer=layer,
                         src=src, blocks=len(pairs)):
                ks, vs = kv["k"].chunk(2, dim=2), kv["v"].chunk(2, dim=2)
                dks = [torch.zeros_like(x) for x in ks]
                dvs = [torch.zeros_like(x) for x in vs]
                for i, j, kind in pairs:
                    p = torch.exp(_scores(qs[i], ks[j], kind, scale) - lses[i].unsqueeze(-1))
                    dvs[j] += p.transpose(-2, -1) @ dos[i]
                    ds = p * (dos[i] @ vs[j].transpose(-2, -1) - deltas[i].unsqueeze(-1))
                    dqs[i] += (ds @ ks[j]) * scale
                    dks[j] += (ds.transpose(-2, -1) @ qs[i]) * scale
                dk, dv = torch.cat(dks, dim=2), torch.cat(dvs, dim=2)
            # the accumulator of `src`'s dK / dV arrives from the previous rank (sent at t-1)
            if acc is not None:
                got = ring.wait(acc)
                dk, dv = got["dk"] + dk, got["dv"] + dv
            acc = ring.start({"dk": dk, "dv": dv}, cp_step=t, phase="bwd", layer=layer)
            if nxt is not None:
                kv = ring.wait(nxt)
        got = ring.wait(acc)  # after cp passes: this rank's own K / V gradients
        return torch.cat(dqs, dim=2), got["dk"], got["dv"], None, None


class RingAttention(nn.Module):
    """Drop-in for `jobs.models.gpt.Attention` on one CP rank (the same q, k, v, proj)."""

    def __init__(self, attn: nn.Module, ring: Ring, layer: int):
        super().__init__()
        self.head_dim = attn.head_dim
        self.q, self.k, self.v, self.proj = attn.q, attn.k, attn.v, attn.proj
        object.__setattr__(self, "ring", ring)  # not a submodule
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        d = self.head_dim
        q = self.q(x).view(b, s, -1, d).transpose(1, 2)  # (b, local heads, local s, d)
        k = self.k(x).view(b, s, -1, d).transpose(1, 2)
        v = self.v(x).view(b, s, -1, d).transpose(1, 2)
        y = _RingAttn.apply(q.contiguous(), k.contiguous(), v.contiguous(), self.ring,
                            self.layer)
        return self.proj(y.transpose(1, 2).reshape(b, s, -1))


class CPEmbedding(nn.Module):
    """Drop-in for `jobs.models.gpt.Embedding`: the position embedding of this rank's chunks."""

    def __init__(self, emb: nn.Module, positions: torch.Tensor):
        super().__init__()
        self.tok, self.pos = emb.tok, emb.pos
        self.register_buffer("positions", positions, persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        assert idx.shape[1] == self.positions.numel(), (idx.shape, self.positions.shape)
        return self.tok(idx) + self.pos(self.positions)


def cp_groups(ctx) -> tuple:
    """(CP group, its global ranks) of this rank; every rank creates every group (new_group
    is collective), in the same order (jobs.dims: the layout)."""
    assert ctx.dims.cp == ctx.spec.parallel.cp, "dims built without the spec's cp"
    return own_group(ctx.dims, "cp", ctx.rank)


def apply_context_parallel(ctx, *models: nn.Module) -> Ring | None:
    """cp > 1: the GPT's (or its pipeline stages') embedding and every block's attention
    replaced for this CP rank, before tensor parallelism shards their linears."""
    cp = ctx.spec.parallel.cp
    if cp == 1:
        return None
    if ctx.spec.parallel.engine != "reference":  # refused at submit too (jobs/spec.py)
        raise NotImplementedError("context parallelism runs on the reference engine only")
    group, ranks = cp_groups(ctx)
    ctx.tracer.group_ranks.update({"cp": ranks})
    ring = Ring(group, ranks, ctx.rank, ctx.tracer)
    pos = cp_positions(ctx.spec.model.seq_len, cp, ring.index).to(ctx.device)
    for model in models:
        if getattr(model, "embed", None) is not None:
            model.embed = CPEmbedding(model.embed, pos)
        first = getattr(model, "first_layer", 0)  # a pipeline stage's global layer index
        for i, blk in enumerate(model.blocks):
            blk.attn = RingAttention(blk.attn, ring, first + i)
    return ring
