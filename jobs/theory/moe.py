"""Expert parallelism's all-to-all volume (standard library only).

Per MoE block and micro-batch, over one EP group of `ep` ranks holding `tokens` tokens between
them (jobs/parallel/expert.py, jobs/parallel/ep_comm.py):

    assignments  A = tokens * top_k - dropped         (dropped = 0 when capacity_factor = 0)
    bound        A <= min(tokens * top_k, (tokens / seq_len) * experts * C),
                 C = ceil(capacity_factor * seq_len * top_k / experts) per sequence
    payload      dispatch fwd, combine fwd, combine bwd, dispatch bwd: A * hidden * act_bytes
                 each, so 4 * A * hidden * act_bytes (nccl-tests S, summed over the group's
                 ranks: a rank's S is its whole send buffer, its own rows included)
    counts       one all-to-all of the per-expert row counts in forward:
                 ep * experts * count_bytes (int64)
    on the wire  routing decides how many rows stay on their rank; with uniform routing the
                 expected part that crosses is (ep - 1) / ep of the payload (convention
                 "uniform-routing", an expectation, not exact)

Convention "group-payload": exact, for any routing, given the dropped count (which the `moe`
trace records carry); it is what tests/moe checks against the traced bytes.

Model state with EP (`ep_model_state`): the DP strategy holds the non-expert parameters
Ψ_dense (ZeRO over dp as jobs.theory.memory says); each rank holds experts / ep of every
block's experts, replicated over the expert-DP group and not ZeRO-sharded (reference EP):
per rank  model_state(Ψ_dense, dp, zero_stage) + (p + g + o) * Ψ_experts / ep.
"""

from __future__ import annotations

import math

A2A_PASSES = 4  # dispatch and combine, forward and backward


def expert_mlp_params(h: int) -> int:
    """One expert: the GPT MLP h -> 4h -> h with biases, 8h^2 + 5h."""
    return 8 * h * h + 5 * h


def expert_params(layers: int, hidden: int, experts: int) -> int:
    """Every block's routed experts (the EP-sharded parameters; router and shared expert are
    not among them)."""
    return layers * experts * expert_mlp_params(hidden)


def ep_model_state(psi: int, psi_experts: int, dp: int, ep: int, zero_stage: int, *,
                   bytes_params: float = 4, bytes_grads: float = 4,
                   bytes_optimizer: float = 8) -> dict:
    """Per-rank params / grads / optimizer bytes with `psi` parameters in all, `psi_experts`
    of them routed experts sharded over ep (module docstring)."""
    from .memory import model_state_bytes
    b = {"bytes_params": bytes_params, "bytes_grads": bytes_grads,
         "bytes_optimizer": bytes_optimizer}
    dense = model_state_bytes(psi - psi_experts, dp, zero_stage, **b)
    local = model_state_bytes(psi_experts / ep, 1, 0, **b)
    return {k: dense[k] + local[k] for k in dense}


def expert_capacity(capacity_factor: float, seq_len: int, top_k: int, experts: int) -> int:
    """Assignments an expert takes per sequence; 0 = unlimited (no dropping)."""
    if capacity_factor <= 0:
        return 0
    return max(1, math.ceil(capacity_factor * seq_len * top_k / experts))


def a2a_bytes(*, tokens: int, hidden: int, top_k: int, experts: int, ep: int, seq_len: int,
              capacity_factor: float = 0.0, dropped: int = 0, act_bytes: int = 4,
              count_bytes: int = 8) -> dict:
    """All-to-all bytes of one MoE block and micro-batch over one EP group (module docstring).
    `dropped`: assignments dropped by capacity in that micro-batch over the group."""
    if ep < 1 or tokens < 0 or dropped < 0:
        raise ValueError("ep >= 1, tokens >= 0 and dropped >= 0 are required")
    routed = tokens * top_k
    cap = expert_capacity(capacity_factor, seq_len, top_k, experts)
    bound = min(routed, (tokens // seq_len) * experts * cap) if cap else routed
    a = routed - dropped
    if a < 0 or a > bound:
        raise ValueError(f"{a} kept assignments outside 0..{bound} (the capacity bound)")
    per_pass = a * hidden * act_bytes
    payload = A2A_PASSES * per_pass if ep > 1 else 0
    counts = ep * experts * count_bytes if ep > 1 else 0
    return {"assignments": a, "assignments_bound": bound, "capacity": cap,
            "payload_per_pass": per_pass if ep > 1 else 0, "payload": payload,
            "counts_payload": counts,
            "wire_uniform_routing": payload * (ep - 1) / ep,
            "formula": "4 * (tokens*top_k - dropped) * hidden * act_bytes (+ ep*experts*8 "
                       "for the counts)",
            "convention": "group-payload",
            "inputs": {"tokens": tokens, "hidden": hidden, "top_k": top_k, "experts": experts,
                       "ep": ep, "seq_len": seq_len, "capacity_factor": capacity_factor,
                       "dropped": dropped, "act_bytes": act_bytes}}
