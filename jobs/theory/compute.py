"""The compute term: busy seconds per rank per step, from configured times or from FLOPs.

    timed   exact: every layer call sleeps its configured time whatever the batch, so a rank
            does rounds x (layers on the rank) x (t_forward + t_backward_input +
            t_backward_weight), rounds = microbatches * grad_accum (jobs/loop.py), layers on
            the rank = layers / pp (v chunks of layers/(pp*v) each). predict()'s _step computes
            it from the stage times (jobs.theory.whatif.stage_times), the one place.
    gpt     Narayanan et al. 2021 (section 5.1, eq. 3): forward + backward of one global batch B
            of s tokens is 72*B*s*L*h^2*(1 + s/(6h) + V/(12*L*h)) FLOPs; activation
            recomputation adds one forward of the transformer layers only, not of the LM head:
            96*B*s*L*h^2*(1 + s/(6h) + V/(16*L*h)) (the paper's formula; the head's term is
            6*B*s*h*V either way).
    gpt MoE every block's MLP is experts (jobs/models/moe.py): each token runs top_k of them
            (+ the shared expert), each the dense MLP's h -> 4h -> h, and the router h x E:
            per layer k*B*s*h^2*(1/3 + 2/3*(top_k + shared) + s/(6h)) + k/12*B*s*h*E with
            k = 72 (96 recomputing); tokens over capacity are not subtracted (an upper bound).
    mlp     each Linear(h, h) is 2*h^2 FLOPs per sample forward, 4*h^2 backward (input and
            weight gradients): 6*B*L*h^2; recomputation adds a forward: 8*B*L*h^2.
layer_flops is one layer's share (gpt without the LM head term); the compute-rate calibration
(jobs/compute_bench.py) divides it by the measured time of one layer's forward + backward.
FLOPs over a rate R (FLOP/s of one device) give the seconds of the whole batch on one device,
predict()'s `compute_ms` (split evenly over dp*tp*pp devices, a lower bound).
Standard library only.
"""

from __future__ import annotations


def _shape(model) -> dict:
    return model if isinstance(model, dict) else {
        k: getattr(model, k) for k in ("arch", "layers", "hidden", "seq_len", "vocab",
                                       "experts", "top_k", "shared_expert")}


def layer_flops(model, batch: int, checkpointing: bool = False) -> tuple[float, str]:
    """FLOPs of one layer's forward + backward over `batch` samples (gpt: sequences), with the
    formula: the per-layer term of training_flops (what jobs.compute_bench times)."""
    m = _shape(model)
    B, h = batch, m["hidden"]
    if m["arch"] == "gpt" and m.get("experts"):
        # the dense 72 = 24 attention + 48 MLP: every token runs top_k experts (+ the shared
        # one), each the dense MLP's size, and the router's h x E; no drops (an upper bound)
        s, k, E = m["seq_len"], 96 if checkpointing else 72, m["experts"]
        n = m.get("top_k", 1) + (1 if m.get("shared_expert") else 0)
        value = k * B * s * h * h * (1 / 3 + 2 / 3 * n + s / (6 * h)) + k / 12 * B * s * h * E
        return float(value), (f"{k}*B*s*h^2*(1/3 + 2/3*(top_k + shared) + s/(6h)) + "
                              f"{k}/12*B*s*h*E (MoE, every block; no token dropped)")
    if m["arch"] == "gpt":
        s, k = m["seq_len"], 96 if checkpointing else 72
        return float(k * B * s * h * h * (1 + s / (6 * h))), f"{k}*B*s*h^2*(1 + s/(6h))"
    if m["arch"] == "mlp":
        k = 8 if checkpointing else 6
        return float(k * B * h * h), f"{k}*B*h^2"
    raise ValueError(f"FLOPs are counted for gpt and mlp, not {m['arch']!r} (timed: "
                     "configured times: jobs.theory.predict, step.per_rank_compute_s)")


def training_flops(model, global_batch: int, checkpointing: bool = False) -> tuple[float, str]:
    """FLOPs of one optimizer step over the global batch (gpt / mlp), with the formula:
    layers x layer_flops, plus for gpt the LM head's 6*B*s*h*V (the formula's V term; the head
    is not recomputed, so recomputation leaves it alone: Narayanan et al. 2021)."""
    m = _shape(model)
    B, L, h = global_batch, m["layers"], m["hidden"]
    per_layer, form = layer_flops(m, B, checkpointing)
    if m["arch"] == "gpt":
        s, V = m["seq_len"], m["vocab"]
        # the head's h x V matmul per token: 2 FLOPs a multiply-add forward, 4 backward:
        # 6*B*s*h*V whatever the recomputation of the layers (72/12 = 96/16 = 6)
        value = L * per_layer + 6 * B * s * h * V
        if m.get("experts"):
            return float(value), f"L x [{form}] + 6*B*s*h*V (LM head, not recomputed)"
        if checkpointing:
            return float(value), ("96*B*s*L*h^2*(1 + s/(6h) + V/(16*L*h)) (Narayanan 2021, "
                                  "recomputation; the LM head is not recomputed)")
        return float(value), "72*B*s*L*h^2*(1 + s/(6h) + V/(12*L*h)) (Narayanan 2021)"
    return float(L * per_layer), f"{8 if checkpointing else 6}*B*L*h^2"

