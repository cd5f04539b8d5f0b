"""Expert parallelism's all-to-all volume (standard library only).

Per MoE block and micro-batch, over one EP group of `ep` ranks holding `tokens` tokens between
them (jobs/parallel/expert.py, jobs/parallel/ep_comm.py):

    assignments  A = tokens * top_k - dropped         (dropped = 0 when capacity_factor = 0)
    bound        A <= min(tokens * top_k, groups * experts * C),
                 C = ceil(capacity_factor * N * top_k / experts) per capacity group of N
                 tokens (a rank's micro-batch, or a sequence: model.capacity_scope)
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
per rank  model_state(Ψ_dense, dp, zero_stage) + (p + g + o) * Ψ_experts / ep
(convention "ep-state").

Per rank per step (`ep_bytes_per_rank`, predict()'s comm.components.ep), convention
"uniform-routing": every expert gets N*top_k/experts assignments per capacity group, so only the
capacity bound drops (A = min(T*top_k, groups*E*C)) and a rank sends (ep - 1)/ep of its rows.
Expected drops of random routing (`expected_dropped`, predict()'s `moe`, convention
"random-routing"): each expert's load is Binomial(N, top_k * share_e), drops its excess over C.
Activations of a MoE block (`moe_saved_bytes`): exact given the kept assignments A and the rows
R this rank's experts compute; R = A under uniform routing (`routing_correction` turns a rank's
traced dispatch records into the exact figure). docs/conventions.md lists all of them.
"""

from __future__ import annotations

import functools
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


CAPACITY_SCOPES = ("rank", "sequence")  # model.capacity_scope (jobs/models/moe.py)


def expert_capacity(capacity_factor: float, tokens: int, top_k: int, experts: int) -> int:
    """Assignments an expert takes per capacity group of `tokens` tokens (a rank's micro-batch
    under capacity_scope "rank", one sequence under "sequence"); 0 = unlimited (no dropping).
    C = ceil(capacity_factor * tokens * top_k / experts), Megatron-Core's
    moe_utils.get_capacity (ceil(num_tokens * topk / num_experts * capacity_factor)), Switch
    Transformer's expert capacity (tokens per batch / experts x capacity factor, top-1) and
    GShard's 2N/E for top-2; at least 1 (DeepSpeed's min_capacity, default 4 there, is not
    applied: convention "capacity")."""
    if capacity_factor <= 0:
        return 0
    return max(1, math.ceil(capacity_factor * tokens * top_k / experts))


def group_tokens(scope: str, seq_len: int, batch: int) -> int:
    """Tokens per capacity group: a rank's micro-batch of `batch` sequences ("rank") or one
    sequence ("sequence")."""
    if scope not in CAPACITY_SCOPES:
        raise ValueError(f"capacity_scope {scope!r} not in {CAPACITY_SCOPES}")
    return seq_len if scope == "sequence" else batch * seq_len


def expected_dropped(*, tokens: int, top_k: int, experts: int, capacity_factor: float,
                     share: list[float] | None = None) -> dict:
    """Expected assignments dropped by capacity in one group of `tokens` tokens when tokens
    route independently (convention "random-routing"): expert e is among a token's top_k
    choices with probability p_e = top_k * share_e (share = each expert's fraction of the routed
    assignments: uniform 1/E by default, or an observed run's router histogram, the `share`
    column of the MoE tables), so its load is X_e ~ Binomial(tokens, p_e) and
        E[dropped] = sum_e E[max(0, X_e - C)] = sum_e sum_{j > C} (j - C) P(X_e = j),
    exact for independent tokens (linearity; which assignments are dropped does not change how
    many). 0 without capacity. Uniform routing at capacity_factor near 1 drops a few percent,
    not 0: the load fluctuates around its mean tokens * top_k / E."""
    e, k = experts, top_k
    share = [1.0 / e] * e if share is None else list(share)
    if len(share) != e or any(x < 0 for x in share) or abs(sum(share) - 1) > 1e-6:
        raise ValueError("share: one non-negative fraction per expert, summing to 1")
    cap = expert_capacity(capacity_factor, tokens, k, e)
    routed = tokens * k
    if not cap:
        return {"value": 0.0, "capacity": 0, "routed": routed, "fraction": 0.0,
                "convention": "random-routing"}
    total = 0.0
    for x in share:
        p = min(1.0, k * x)
        if cap >= tokens or p == 0.0:
            continue
        if p == 1.0:
            total += tokens - cap
            continue
        # E[max(0, X - C)] = E[X] - C + sum_{j < C} (C - j) P(X = j)
        lp, lq = math.log(p), math.log1p(-p)
        low = sum((cap - j) * math.exp(math.lgamma(tokens + 1) - math.lgamma(j + 1)
                                       - math.lgamma(tokens - j + 1) + j * lp
                                       + (tokens - j) * lq) for j in range(cap))
        total += tokens * p - cap + low
    return {"value": total, "capacity": cap, "routed": routed,
            "fraction": total / routed if routed else 0.0,
            "formula": "sum_e E[max(0, X_e - C)], X_e ~ Binomial(tokens, top_k*share_e), "
                       "C = ceil(capacity_factor*tokens*top_k/E)",
            "convention": "random-routing"}


ROUTER_LOGIT_STD = 1 / math.sqrt(3)  # router(LayerNorm(x)) at initialisation, see bias_share
_GRID = [i * 0.1 for i in range(-85, 86)]  # standard normal abscissae for bias_share


def _norm_sf(x: float) -> float:
    return 0.5 * math.erfc(x / math.sqrt(2))


def bias_share(bias: dict[int, float], experts: int, top_k: int,
               std: float = ROUTER_LOGIT_STD) -> list[float] | None:
    """Each expert's share of the routed assignments when `bias` (model.router_bias) is added
    to the router logits (convention "gaussian-router"; None = no bias: uniform).

    Model: a token's logits without the bias are independent N(0, std^2), one per expert.
    At initialisation this is what paralab's router computes: z_e = w_e . x with x a LayerNorm
    output (sum x_i^2 = h) and w_e Kaiming-uniform rows U(-1/sqrt(h), 1/sqrt(h)), so given x
    the z_e are independent with variance h * (1/h)/3 = 1/3 (std 1/sqrt(3)), near-Gaussian by
    the central limit over h terms. Then, exactly under the model, with v = b_e + std*t:
        P(e in top_k) = E_t[ P(fewer than top_k of the other experts have z_j + b_j > v) ],
    t ~ N(0, 1), the others exceeding independently with q_j = P(N(0,1) > (v - b_j)/std)
    (a Poisson-binomial count, summed per group of equal biases), the expectation by the
    trapezoid rule on t in [-8.5, 8.5], step 0.1 (error below 1e-9 here: the integrand is
    smooth on the scale of t = 1).
    share_e = P(e in top_k) / top_k. Top-k of the logits is top-k of the softmax (monotone),
    so the router's softmax needs no separate treatment. After training the logits are
    neither independent nor of this spread: an observed run's histogram (`router_share`)
    replaces this model then."""
    b = [0.0] * experts
    for e, v in (bias or {}).items():
        b[int(e)] = float(v)
    if all(v == b[0] for v in b):
        return None
    k = min(top_k, experts)
    return list(_bias_share(tuple(b), k, float(std)))


def _binom_counts(m: int, q: float, k: int) -> list[float]:
    """P(c of m independent events of probability q happen), c = 0..k-1."""
    return [math.comb(m, c) * q ** c * (1 - q) ** (m - c) if c <= m else 0.0 for c in range(k)]


@functools.lru_cache(maxsize=256)
def _bias_share(b: tuple[float, ...], k: int, std: float) -> tuple[float, ...]:
    levels: dict[float, int] = {}
    for v in b:
        levels[v] = levels.get(v, 0) + 1
    w = [math.exp(-t * t / 2) / math.sqrt(2 * math.pi) * 0.1 for t in _GRID]
    w[0] /= 2
    w[-1] /= 2
    p_in: dict[float, float] = {}
    for be in levels:
        tot = 0.0
        for t, wt in zip(_GRID, w, strict=True):
            v = be + std * t
            qs = [(m - (bj == be), _norm_sf((v - bj) / std)) for bj, m in levels.items()]
            if k <= 2 and all(q < 1 for _, q in qs):
                # P(none above) = prod (1-q)^m; with k = 2 plus P(exactly one above)
                none = math.prod((1 - q) ** m for m, q in qs)
                tot += wt * none * (1 + (sum(m * q / (1 - q) for m, q in qs) if k == 2 else 0))
                continue
            dist = [1.0] + [0.0] * (k - 1)  # P(c others above v), c < k
            for m, q in qs:
                cnt = _binom_counts(m, q, k)
                dist = [sum(dist[i] * cnt[c - i] for i in range(c + 1)) for c in range(k)]
            tot += wt * sum(dist)
        p_in[be] = tot
    share = [p_in[v] / k for v in b]
    norm = sum(share)  # = 1 up to the quadrature error
    return tuple(x / norm for x in share)


def a2a_bytes(*, tokens: int, hidden: int, top_k: int, experts: int, ep: int, seq_len: int,
              capacity_factor: float = 0.0, dropped: int = 0, act_bytes: int = 4,
              count_bytes: int = 8, group: int | None = None) -> dict:
    """All-to-all bytes of one MoE block and micro-batch over one EP group (module docstring).
    `dropped`: assignments dropped by capacity in that micro-batch over the group; `group`:
    tokens per capacity group (default seq_len, capacity_scope "sequence"; a rank's
    micro-batch tokens under "rank")."""
    if ep < 1 or tokens < 0 or dropped < 0:
        raise ValueError("ep >= 1, tokens >= 0 and dropped >= 0 are required")
    routed = tokens * top_k
    n = group or seq_len
    cap = expert_capacity(capacity_factor, n, top_k, experts)
    bound = min(routed, (tokens // n) * experts * cap) if cap else routed
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


def uniform_kept(tokens: int, seq_len: int, top_k: int, experts: int,
                 capacity_factor: float = 0.0, group: int | None = None) -> int:
    """Kept assignments of `tokens` tokens under uniform routing (convention "uniform-routing":
    every expert gets n*top_k/experts assignments per capacity group of n = `group` tokens
    (default seq_len: capacity_scope "sequence"), so capacity drops only what exceeds C, i.e.
    when capacity_factor < 1): min(tokens*top_k, groups*experts*C). The expected drops of
    random routing are expected_dropped's."""
    n = group or seq_len
    cap = expert_capacity(capacity_factor, n, top_k, experts)
    routed = tokens * top_k
    return min(routed, (tokens // n) * experts * cap) if cap else routed


def moe_dims(w: dict) -> dict:
    """moe_saved_bytes' model inputs from predict()'s inputs (jobs.theory.whatif)."""
    return {"batch": w["micro_batch_size"], "seq_len": w["seq_len"], "hidden": w["hidden"],
            "experts": w["experts"], "top_k": w["top_k"],
            "capacity_factor": w["capacity_factor"], "shared_expert": w["shared_expert"],
            "aux_loss": bool(w.get("aux_loss_coef")),
            "capacity_scope": w.get("capacity_scope", "rank")}


def moe_saved_bytes(*, batch: int, seq_len: int, hidden: int, experts: int, top_k: int,
                    capacity_factor: float = 0.0, shared_expert: bool = False,
                    aux_loss: bool = True, act_bytes: float = 4, kept: float | None = None,
                    rows: float | None = None, capacity_scope: str = "rank"
                    ) -> tuple[float, str]:
    """Bytes one MoE block (jobs/models/moe.py, experts local or jobs/parallel/expert.py's
    EPExperts) saves for backward per micro-batch of `batch` sequences, beyond the LayerNorm
    output it reads (counted with the block), as jobs.memory.SavedTensorCounter counts them.
    T = batch*seq_len tokens, A = `kept` assignments (default uniform_kept), R = `rows` the
    experts on this rank compute (default A: no EP, or EP under uniform routing, where a rank
    receives what it sends). Router: softmax output 4*T*E (fp32), the top-k slice of the sort
    indices 8*((T-1)*E + k), with top_k > 1 the gate and its sum 4*T*(k + 1), the per-sequence
    fraction f 4*b*E (with `aux_loss` only: without the loss in backward its graph, and f, are
    freed at the end of the forward), the keep mask T*k bytes; indices: order and token 8*A
    each; experts: input, fc1 output, GELU output 9*h*R; combine: the experts' output and the
    weighted output 2*h*A, the gate column A (all x act_bytes); shared expert 8*h*T x
    act_bytes."""
    t, e, k, h = batch * seq_len, experts, top_k, hidden
    a = uniform_kept(t, seq_len, k, e, capacity_factor,
                     group_tokens(capacity_scope, seq_len, batch)) if kept is None else kept
    r = a if rows is None else rows
    router = 4 * t * e + 8 * ((t - 1) * e + k) + (4 * t * (k + 1) if k > 1 else 0) \
        + (4 * batch * e if aux_loss else 0) + t * k
    val = router + 16 * a + act_bytes * (9 * h * r + 2 * h * a + a) \
        + (act_bytes * 8 * h * t if shared_expert else 0)
    formula = ("4TE + 8((T-1)E + k) + [k>1] 4T(k+1) + [aux] 4bE + Tk + 16A"
               " + act_bytes*(9hR + 2hA + A)"
               + (" + act_bytes*8hT (shared)" if shared_expert else "")
               + "; A = min(T*k, groups*E*C), R = A (uniform routing)")
    return float(val), formula


def ep_bytes_per_rank(*, tokens: int, hidden: int, top_k: int, experts: int, ep: int,
                      seq_len: int, capacity_factor: float = 0.0, act_bytes: float = 4,
                      layers: int = 1, rounds: int = 1, capacity_scope: str = "rank") -> dict:
    """Bytes one EP rank sends per step: `tokens` = its tokens per micro-batch, `layers` MoE
    blocks, `rounds` micro-batches per step. The group's payload is a2a_bytes on ep*tokens
    tokens (exact given the drops; here the uniform-routing drops), and a rank sends
    (ep - 1)/ep of its share under uniform routing (convention "uniform-routing"); the counts
    all-to-all sends (ep - 1)/ep * E * 8 bytes per block exactly."""
    if ep <= 1:
        return {"value": 0.0, "group_payload": 0.0, "counts": 0.0, "formula": "0 (ep = 1)",
                "inputs": {"ep": ep}}
    group = ep * tokens
    n = seq_len if capacity_scope == "sequence" else tokens  # a rank's micro-batch
    a = uniform_kept(group, seq_len, top_k, experts, capacity_factor, n)
    g = a2a_bytes(tokens=group, hidden=hidden, top_k=top_k, experts=experts, ep=ep,
                  seq_len=seq_len, capacity_factor=capacity_factor,
                  dropped=group * top_k - a, act_bytes=act_bytes, group=n)
    n = layers * rounds
    wire = g["wire_uniform_routing"] / ep * n
    counts = g["counts_payload"] / ep * (ep - 1) / ep * n
    return {"value": wire + counts, "dispatch_combine": wire, "counts": counts,
            "group_payload": g["payload"] * n, "group_counts_payload": g["counts_payload"] * n,
            "formula": "layers*rounds x [(ep-1)/ep * 4*A*h*act_bytes + (ep-1)/ep * E*8], "
                       "A = min(tokens*top_k, b*E*C) per rank (uniform routing)",
            "inputs": {"tokens": tokens, "hidden": hidden, "top_k": top_k, "experts": experts,
                       "ep": ep, "seq_len": seq_len, "capacity_factor": capacity_factor,
                       "act_bytes": act_bytes, "layers": layers, "rounds": rounds,
                       "capacity_scope": capacity_scope,
                       "assignments_per_rank": a / ep},
            "convention": "uniform-routing"}


def routing_correction(records, *, batch: int, seq_len: int, hidden: int, experts: int,
                       top_k: int, capacity_factor: float = 0.0, shared_expert: bool = False,
                       aux_loss: bool = True, act_bytes: float = 4,
                       capacity_scope: str = "rank") -> dict:
    """{(step, microbatch): bytes} to add to the uniform-routing activations of one rank for
    the routing it really saw, moe_saved_bytes(kept=A, rows=R) - moe_saved_bytes() summed over
    its MoE blocks: with EP per forward dispatch record (jobs/parallel/ep_comm.py; A = rows
    sent, R = rows received); without, per `moe` record (A = R = routed - dropped
    assignments: capacity drops differ from the uniform ones). A trace analysis adds the
    largest in-flight sum to the prediction to compare with the measured peak."""
    dims = {"batch": batch, "seq_len": seq_len, "hidden": hidden, "experts": experts,
            "top_k": top_k, "capacity_factor": capacity_factor,
            "shared_expert": shared_expert, "aux_loss": aux_loss, "act_bytes": act_bytes,
            "capacity_scope": capacity_scope}
    base = moe_saved_bytes(**dims)[0]
    row = hidden * act_bytes
    records = list(records)
    ep = any(x.get("type") == "comm" and x.get("what") == "dispatch" for x in records)
    out: dict = {}
    for x in records:
        if ep and x.get("type") == "comm" and x.get("what") == "dispatch" \
                and x.get("phase") == "fwd":
            a, r = sum(x["send_bytes"]) / row, sum(x["recv_bytes"]) / row
        elif not ep and x.get("type") == "moe":
            a = r = sum(x["tokens_per_expert"]) - x["dropped"]
        else:
            continue
        k = (x["step"], x["microbatch"])
        out[k] = out.get(k, 0.0) + moe_saved_bytes(**dims, kept=a, rows=r)[0] - base
    return out


def inflight_correction(corr: dict, inflight: int) -> float:
    """The largest correction of `inflight` micro-batches of one step held at once (a pipeline
    rank's peak holds several; the schedule's in-flight count, jobs/theory/ranks.py)."""
    steps: dict = {}
    for (step, _), v in corr.items():
        steps.setdefault(step, []).append(v)
    return max((sum(sorted(v, reverse=True)[:max(1, inflight)]) for v in steps.values()),
               default=0.0)


def moe_prediction(w: dict) -> dict | None:
    """predict()'s `moe` section: capacity and the expected drops per rank per micro-batch and
    MoE block under random routing (expected_dropped; `router_share`, an observed run's
    per-expert share, replaces the uniform one when given, else the share `router_bias`
    implies, bias_share). None for a dense model."""
    if not w.get("experts"):
        return None
    scope = w.get("capacity_scope", "rank")
    b, s, k, e = w["micro_batch_size"], w["seq_len"], w["top_k"], w["experts"]
    n = group_tokens(scope, s, b)
    groups = (b * s) // n
    share, conv = w.get("router_share"), "random-routing"
    if share is None and w.get("router_bias"):
        from jobs.spec import parse_router_bias  # (jobs.spec imports this module's names)
        bias = w["router_bias"]
        share = bias_share(parse_router_bias(bias) if isinstance(bias, str) else bias, e, k)
        conv = "random-routing, gaussian-router" if share else conv
    one = expected_dropped(tokens=n, top_k=k, experts=e, capacity_factor=w["capacity_factor"],
                           share=share)
    routed = b * s * k
    dropped = groups * one["value"]
    return {"capacity_scope": scope, "group_tokens": n, "groups_per_microbatch": groups,
            "capacity": one["capacity"], "routed_per_microbatch": routed,
            "expected_dropped_per_microbatch": dropped,
            "expected_dropped_fraction": dropped / routed if routed else 0.0,
            "router_share": share,
            "formula": f"groups x {one.get('formula', '0 (no capacity)')}"
                       + ("; share_e = P(e in top_k of N(0, 1/3) logits + router_bias)/top_k"
                          if conv != "random-routing" else ""),
            "convention": conv}
