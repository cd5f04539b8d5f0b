"""A small GPT-style transformer: token + position embedding, pre-LayerNorm blocks of causal
self-attention and a GELU MLP, a final LayerNorm and an LM head; optionally dropout on the
embedding output (`model.dropout`).

Plain modules, no parallel branches: tensor parallelism (jobs/parallel/tensor.py) swaps the
linears of a finished model for sharded ones, and pipeline parallelism
(jobs/parallel/pipeline/stage.py) keeps a slice of `embed`, `blocks`, `head`. Attention infers
its local head count from the q projection's width, so it runs unchanged on a head shard.
Initial parameters depend only on the seed: every rank builds the full model, then shards it.
With `model.experts > 0` each block's MLP is a mixture of experts (jobs/models/moe.py).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from jobs.models.moe import MoE


class Embedding(nn.Module):
    def __init__(self, vocab: int, seq_len: int, hidden: int, dropout: float = 0.0):
        super().__init__()
        self.tok = nn.Embedding(vocab, hidden)
        self.pos = nn.Embedding(seq_len, hidden)
        # GPT-2's embedding dropout (model.dropout): its masks are the one thing drawn from
        # the rank's global RNG during training, the stream a checkpoint saves and a resume
        # restores (jobs/ckpt.py). Without it no submodule, so nothing else changes.
        self.drop = nn.Dropout(dropout) if dropout else None

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        return self.drop(x) if self.drop is not None else x


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.head_dim = hidden // heads
        self.q = nn.Linear(hidden, hidden)
        # No key bias: it shifts every score of a query equally, so softmax ignores it and its
        # gradient is exactly zero; Adam would turn the round-off in that zero into full steps.
        self.k = nn.Linear(hidden, hidden, bias=False)
        self.v = nn.Linear(hidden, hidden)
        self.proj = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        d = self.head_dim
        q = self.q(x).view(b, s, -1, d).transpose(1, 2)  # (b, local heads, s, d)
        k = self.k(x).view(b, s, -1, d).transpose(1, 2)
        v = self.v(x).view(b, s, -1, d).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d)
        mask = torch.ones(s, s, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, s, -1)
        return self.proj(y)


class MLP(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.fc2 = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int, moe: dict | None = None):
        super().__init__()
        self.ln1 = nn.LayerNorm(hidden)
        self.attn = Attention(hidden, heads)
        self.ln2 = nn.LayerNorm(hidden)
        self.mlp = MoE(hidden, make_mlp=MLP, **moe) if moe else MLP(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Head(nn.Module):
    """Final LayerNorm and the LM head (logits over the vocabulary)."""

    def __init__(self, hidden: int, vocab: int):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.out = nn.Linear(hidden, vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(x))


class GPT(nn.Module):
    def __init__(self, *, vocab: int, seq_len: int, hidden: int, heads: int, layers: int,
                 moe: dict | None = None, dropout: float = 0.0):
        super().__init__()
        self.embed = Embedding(vocab, seq_len, hidden, dropout)
        self.blocks = nn.ModuleList(Block(hidden, heads, moe) for _ in range(layers))
        self.head = Head(hidden, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        for blk in self.blocks:
            x = blk(x)
        return self.head(x)


def build(model_spec, seed: int) -> GPT:
    """The full model from `spec.model`; parameters depend only on `seed`."""
    torch.manual_seed(seed)
    m = model_spec
    return GPT(vocab=m.vocab, seq_len=m.seq_len, hidden=m.hidden, heads=m.heads, layers=m.layers,
               moe=moe_settings(m), dropout=getattr(m, "dropout", 0.0))


def moe_settings(m) -> dict | None:
    """The MoE block's settings from `spec.model` (None: dense MLPs)."""
    if not getattr(m, "experts", 0):
        return None
    from jobs.spec import parse_router_bias
    return {"experts": m.experts, "top_k": m.top_k, "capacity_factor": m.capacity_factor,
            "aux_loss_coef": m.aux_loss_coef, "router_bias": parse_router_bias(m.router_bias),
            "shared_expert": m.shared_expert,
            "capacity_scope": getattr(m, "capacity_scope", "rank")}


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def batch(model_spec, global_batch: int, seed: int, step: int):
    """Token ids and next-token targets of one global batch: a function of seed and step only."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    toks = torch.randint(0, model_spec.vocab, (global_batch, model_spec.seq_len + 1), generator=g)
    return toks[:, :-1].contiguous(), toks[:, 1:].contiguous()
