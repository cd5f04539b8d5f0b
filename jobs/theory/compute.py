"""The compute term: busy seconds per rank per step, from configured times or from FLOPs.

    timed   exact: every layer call sleeps its configured time whatever the batch, so a rank
            does rounds x (layers on the rank) x (t_forward + t_backward_input +
            t_backward_weight), rounds = microbatches * grad_accum (jobs/loop.py), layers on
            the rank = layers / pp (v chunks of layers/(pp*v) each).
    gpt     Narayanan et al. 2021 (eq. 3): forward + backward of one global batch B of s tokens
            is 72*B*s*L*h^2*(1 + s/(6h) + V/(12*L*h)) FLOPs; activation recomputation adds one
            forward: x 4/3 (96 instead of 72).
    mlp     each Linear(h, h) is 2*h^2 FLOPs per sample forward, 4*h^2 backward (input and
            weight gradients): 6*B*L*h^2; recomputation adds a forward: 8*B*L*h^2.
FLOPs over a rate R (FLOP/s of one device) give the seconds of the whole batch on one device,
predict()'s `compute_ms` (split evenly over dp*tp*pp devices, a lower bound).
Standard library only.
"""

from __future__ import annotations


def training_flops(model, global_batch: int, checkpointing: bool = False) -> tuple[float, str]:
    """FLOPs of one optimizer step over the global batch (gpt / mlp), with the formula."""
    m = model if isinstance(model, dict) else {k: getattr(model, k) for k in
                                               ("arch", "layers", "hidden", "seq_len", "vocab")}
    B, L, h = global_batch, m["layers"], m["hidden"]
    if m["arch"] == "gpt":
        s, V = m["seq_len"], m["vocab"]
        k = 96 if checkpointing else 72
        value = k * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * L * h))
        return float(value), f"{k}*B*s*L*h^2*(1 + s/(6h) + V/(12*L*h)) (Narayanan 2021)"
    if m["arch"] == "mlp":
        k = 8 if checkpointing else 6
        return float(k * B * L * h * h), f"{k}*B*L*h^2"
    raise ValueError(f"FLOPs are counted for gpt and mlp, not {m['arch']!r} (timed: "
                     "configured times, timed_busy_s)")


def timed_busy_s(spec) -> float:
    """Seconds one rank of a `timed` spec spends in its layers per step (exact)."""
    m, p = spec.model, spec.parallel
    rounds = p.microbatches * spec.train.grad_accum
    per_layer = m.t_forward + m.t_backward_input + m.t_backward_weight
    return rounds * (m.layers / p.pp) * per_layer
