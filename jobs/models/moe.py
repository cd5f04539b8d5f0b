"""Mixture of experts: the MoE block that replaces the GPT's dense MLP when `model.experts > 0`.

Plain modules, no parallel branches: expert parallelism (jobs/parallel/expert.py) swaps the
`experts` container of a finished model for one that holds this rank's experts and moves tokens
by all-to-all, as tensor parallelism swaps linears.

Routing (per token): logits = router(x) + router_bias; probabilities = softmax over experts;
the top_k experts by probability, ties to the lower expert index (a stable sort), gate weights =
the chosen probabilities, renormalised over the k choices when top_k > 1.

Capacity groups (`capacity_scope`, GShard's "group"):
  "rank" (default; Switch Transformer, GShard, DeepSpeed, Megatron-Core): the group is the tokens
         one rank routes in one forward, its micro-batch of b sequences, N = b * seq_len tokens.
         `capacity_group` (sequences per group; None = the whole forward input) lets a single
         process route a global batch in the groups the ranks of a layout would route
         (tests/support/gate.py sets it to the layout's micro-batch size).
  "sequence": every sequence is its own group, N = seq_len (a sample's drops do not depend on
         which samples share its rank; paralab's rule before issue 38).

Capacity (capacity_factor > 0): each expert takes at most C = ceil(capacity_factor * N * top_k /
experts) assignments per group (Megatron-Core's get_capacity; jobs.theory.moe.expert_capacity).
Drop rule, by order (GShard's priority, Megatron-Core's drop_policy "position"): every token's
first choice before any token's second choice, ..., and within one choice level the earlier
token of the group first (flat order: sequence, then position); the assignments beyond C are
dropped (that expert contributes nothing to that token; the residual connection carries it).
Dropped counts are in `stats`. The auxiliary loss stays per sequence in both scopes.

Auxiliary load-balancing loss (Switch Transformer eq. 4, GShard's top-k form), per sequence:
aux = E * sum_e f_e * P_e, with f_e = (assignments routed to e before dropping) / (S * top_k)
and P_e = mean router probability of e over the sequence; 1 when perfectly balanced. The block's
term is aux_loss_coef * mean over the micro-batch's sequences. It is not added to the returned
activations: its gradient is injected in backward (`_AuxLoss`, Megatron's MoEAuxLossAutoScaler)
scaled by `aux_grad_scale`, which the composition sets to the factor the loss is scaled by
(1 / micro-batches), so the training loss reported stays the language-model loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from jobs.theory.moe import CAPACITY_SCOPES
from jobs.theory.moe import expert_capacity as capacity  # the one definition of C


@dataclass
class Routing:
    """Kept assignments of a micro-batch, sorted by expert (stable: token order within one)."""

    token: torch.Tensor  # (A,) flat token index b * S + s
    weight: torch.Tensor  # (A,) gate weight (differentiable)
    counts: list  # kept assignments per expert, len E
    routed: torch.Tensor  # (E,) assignments routed to each expert before capacity
    dropped: torch.Tensor  # (E,) of those, dropped by capacity
    aux: torch.Tensor  # scalar: mean over sequences of E * sum f_e P_e


class Experts(nn.ModuleDict):
    """The experts of one block, keyed '0'..'E-1' (the full model's parameter names).
    forward(tokens sorted by expert, counts per expert) -> their outputs, same order."""

    def forward(self, x: torch.Tensor, counts: list) -> torch.Tensor:
        parts = x.split(counts)
        return torch.cat([self[str(e)](p) for e, p in enumerate(parts)])


class _AuxLoss(torch.autograd.Function):
    """Identity on `y`; in backward the auxiliary loss gets gradient `scale` (Megatron's
    MoEAuxLossAutoScaler: the aux loss joins backward without being added to the output)."""

    @staticmethod
    def forward(ctx, y, aux, scale: float):
        ctx.scale = scale
        return y.view_as(y)

    @staticmethod
    def backward(ctx, g):
        return g, torch.full((), ctx.scale, dtype=torch.float32, device=g.device), None


class MoE(nn.Module):
    def __init__(self, hidden: int, *, experts: int, top_k: int, capacity_factor: float,
                 aux_loss_coef: float, router_bias: dict, shared_expert: bool, make_mlp,
                 capacity_scope: str = "rank"):
        super().__init__()
        if capacity_scope not in CAPACITY_SCOPES:
            raise ValueError(f"capacity_scope {capacity_scope!r} not in {CAPACITY_SCOPES}")
        self.n_experts, self.top_k, self.capacity_factor = experts, top_k, capacity_factor
        self.capacity_scope = capacity_scope
        self.capacity_group: int | None = None  # rank scope: sequences per group (None: all)
        self.aux_loss_coef = aux_loss_coef
        self.aux_grad_scale = 1.0  # set by the composition: the loss's micro-batch factor
        self.router = nn.Linear(hidden, experts, bias=False)
        self.experts = Experts({str(e): make_mlp(hidden) for e in range(experts)})
        self.shared = make_mlp(hidden) if shared_expert else None
        bias = torch.zeros(experts)
        for e, b in router_bias.items():
            bias[e] = b
        self.register_buffer("logit_bias", bias, persistent=False)
        self.stats: dict | None = None  # the last forward's routing counts (for the tracer)

    def route(self, x: torch.Tensor) -> Routing:
        b, s, _ = x.shape
        e, k = self.n_experts, self.top_k
        probs = (self.router(x) + self.logit_bias).float().softmax(-1)  # (b, s, E)
        choice = torch.sort(-probs.detach(), dim=-1, stable=True).indices[..., :k]  # (b, s, k)
        gate = probs.gather(-1, choice)
        if k > 1:
            gate = gate / gate.sum(-1, keepdim=True)
        onehot = F.one_hot(choice, e)  # (b, s, k, E)
        g = 1 if self.capacity_scope == "sequence" else (self.capacity_group or b)
        if b % g:
            raise ValueError(f"{b} sequences do not split into capacity groups of {g}")
        n = g * s  # tokens per group
        cap = capacity(self.capacity_factor, n, k, e)
        if cap:  # queue position of each assignment in its expert, choice-major (GShard)
            grp = onehot.reshape(b // g, n, k, e)
            pri = grp.transpose(1, 2).reshape(b // g, k * n, e)
            pos = (pri.cumsum(1) * pri).reshape(b // g, k, n, e).transpose(1, 2).sum(-1)
            keep = (pos <= cap).reshape(b, s, k)
        else:
            keep = torch.ones_like(choice, dtype=torch.bool)
        routed_per_seq = onehot.sum(dim=(1, 2))  # (b, E)
        f = routed_per_seq.float() / (s * k)
        aux = (e * (f * probs.mean(1)).sum(-1)).mean()
        token = torch.arange(b * s, device=x.device).repeat_interleave(k)
        exp, w, kp = choice.reshape(-1), gate.reshape(-1), keep.reshape(-1)
        token, exp, w = token[kp], exp[kp], w[kp]
        order = torch.sort(exp, stable=True).indices
        kept = torch.bincount(exp, minlength=e)
        routed = routed_per_seq.sum(0)
        return Routing(token[order], w[order], kept.tolist(), routed, routed - kept, aux)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        r = self.route(x)
        flat = x.reshape(b * s, h)
        out = self.experts(flat[r.token], r.counts)
        y = torch.zeros_like(flat).index_add(0, r.token, out * r.weight.unsqueeze(1).to(out))
        if self.shared is not None:
            y = y + self.shared(flat)
        self.stats = {"tokens": b * s, "tokens_per_expert": r.routed.tolist(),
                      "dropped_per_expert": r.dropped.tolist(), "aux_loss": float(r.aux.detach())}
        if self.aux_loss_coef and torch.is_grad_enabled():
            y = _AuxLoss.apply(y, r.aux, self.aux_loss_coef * self.aux_grad_scale)
        return y.view(b, s, h)


def moe_blocks(model: nn.Module) -> list[tuple[str, MoE]]:
    """(qualified name, block) of every MoE block, in model order."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, MoE)]
