"""Parameter counts and activation-memory estimates of the three model families (no torch).

Assumptions (they mirror jobs/models/mlp.py, jobs/models/gpt.py and jobs/models/timed.py;
if those change, these must follow):

    mlp    `layers` x Linear(h, h) (ReLU between them; regression onto sin(x), no head):
           L*(h^2 + h)
    gpt    token embedding vocab*h + learned positions seq_len*h; per block LN 2h, q/k/v 3h^2+2h
           (no key bias: its gradient is identically zero under softmax, so the model omits it)
           proj h^2+h, LN 2h, MLP h->4h->h 8h^2+5h (= 12h^2 + 12h); final LN 2h; LM head h*vocab,
           no bias, untied from the embedding. With `experts` E > 0 (jobs/models/moe.py) the
           MLP becomes a router h*E (no bias) and E expert MLPs (+1 with shared_expert):
           block 4h^2 + 7h + h*E + (E + shared)*(8h^2 + 5h).
    timed  `layers` x one Linear(h, h) (h^2 + h): each timed layer does a tiny real linear map;
           no head.

Tensor parallelism (jobs/parallel/tensor.py, Megatron): q/k/v, fc1 (weights and biases) and proj,
fc2 (weights) are split over tp; LayerNorms, the proj/fc2 biases, the embeddings and the LM head
are replicated. mlp and timed are not tensor-parallel in paralab; for them the what-if rule
"parameters / tp" is used. Pipeline parallelism: the blocks are split evenly over p*v chunks;
chunk c of rank r is stage c*p + r (zbv's V placement: rank r holds stages r and 2p-1-r, see
jobs.schedules.stage_of); stage 0 also holds the embeddings, the last stage the head.
"""

from __future__ import annotations

import math

from .moe import expert_mlp_params


def block_params(h: int) -> int:
    """One GPT block: 12h^2 + 12h (q, v with bias, k without)."""
    return 12 * h * h + 12 * h


def block_rank_params(h: int, tp: int, experts: int = 0, shared_expert: bool = False) -> float:
    """One block's parameters on one TP rank: q/k/v, proj weight (and with a dense MLP fc1,
    fc2 weight) split over tp, LayerNorms and the proj / fc2 biases replicated. A MoE block
    runs whole on every TP rank (reference TP splits attention only, jobs/spec.py)."""
    if not experts:
        return (12 * h * h + 6 * h) / tp + 6 * h
    return (4 * h * h + 2 * h) / tp + 5 * h + h * experts + \
        (experts + int(shared_expert)) * expert_mlp_params(h)


def moe_extra_block_params(h: int, experts: int, shared_expert: bool = False) -> int:
    """What a MoE block holds beyond a dense block: the router and the extra expert MLPs."""
    if not experts:
        return 0
    return h * experts + (experts + int(shared_expert) - 1) * expert_mlp_params(h)


def param_count(model) -> int:
    """Total parameters of `spec.model` (a ModelSpec or a dict with the same fields)."""
    m = _fields(model)
    h, L = m["hidden"], m["layers"]
    if m["arch"] in ("mlp", "timed"):
        return L * (h * h + h)
    if m["arch"] == "gpt":
        extra = moe_extra_block_params(h, m.get("experts", 0), m.get("shared_expert", False))
        return ((m["vocab"] + m["seq_len"]) * h + L * (block_params(h) + extra) + 2 * h
                + h * m["vocab"])
    raise ValueError(f"unknown arch {m['arch']!r}")


def _fields(model) -> dict:
    if isinstance(model, dict):
        from jobs.spec import ModelSpec
        base = {k: getattr(ModelSpec(), k) for k in _MODEL_KEYS}
        return {**base, **model}
    return {k: getattr(model, k, 0) for k in _MODEL_KEYS}


_MODEL_KEYS = ("arch", "layers", "hidden", "heads", "seq_len", "vocab", "experts",
               "shared_expert")


def rank_blocks(layers: int, pp: int, v: int, placement: str = "loop") -> list[int]:
    """Blocks held by each pipeline rank (its v chunks; the split of stage_params)."""
    from jobs.schedules import stage_of

    chunks = pp * v
    per_chunk, extra = divmod(layers, chunks)
    return [sum(per_chunk + (1 if stage_of(r, c, pp, v, placement) < extra else 0)
                for c in range(v)) for r in range(pp)]


def stage_params(model, pp: int, v: int, tp: int, placement: str = "loop") -> list[int]:
    """Parameters held by one TP rank of each pipeline rank (index = pipeline rank);
    `placement` is jobs.schedules.placement_of(schedule)."""
    from jobs.schedules import stage_of

    m = _fields(model)
    h, L = m["hidden"], m["layers"]
    chunks = pp * v
    per_chunk = L // chunks
    extra = L - per_chunk * chunks  # validated specs have none; spread over the first chunks
    out = []
    for r in range(pp):
        total = 0.0
        for c in range(v):
            s = stage_of(r, c, pp, v, placement)
            nblocks = per_chunk + (1 if s < extra else 0)
            if m["arch"] == "gpt":  # experts not split by EP here (whatif.inputs_from_spec)
                total += nblocks * block_rank_params(h, tp, m["experts"], m["shared_expert"])
                if s == 0:
                    total += (m["vocab"] + m["seq_len"]) * h
                if s == chunks - 1:
                    total += 2 * h + h * m["vocab"]
            else:
                total += nblocks * (h * h + h) / tp
        out.append(math.ceil(total))
    return out


def gpt_activation_bytes_per_layer(s: int, b: int, h: int, a: int, tp: int = 1,
                                   sequence_parallel: bool = False,
                                   checkpointing: bool = False,
                                   act_bytes: int = 2) -> tuple[float, str]:
    """Korthikanti et al. 2022 ("Reducing Activation Recomputation"), per layer, 2-byte
    activations scaled by act_bytes/2; includes dropout masks and the s^2 attention scores
    (seed 004: "二次注意力项 5as/h", "剩余项 10sbh")."""
    scale = act_bytes / 2
    if checkpointing:
        val = 2 * s * b * h / (tp if sequence_parallel else 1)
        return val * scale, "2*s*b*h" + ("/t" if sequence_parallel else "") + \
            " (full recompute: only the block input is kept)"
    if tp == 1:
        return s * b * h * (34 + 5 * a * s / h) * scale, "s*b*h*(34 + 5*a*s/h)"
    if sequence_parallel:
        return s * b * h / tp * (34 + 5 * a * s / h) * scale, "s*b*h/t*(34 + 5*a*s/h)"
    return s * b * h * (10 + 24 / tp + 5 * a * s / (h * tp)) * scale, \
        "s*b*h*(10 + 24/t + 5*a*s/(h*t))"


def simple_activation_bytes_per_layer(arch: str, b: int, h: int,
                                      act_bytes: int = 4) -> tuple[float, str]:
    """mlp: Linear input + ReLU output saved (2*b*h); timed: the layer input (b*h)."""
    if arch == "mlp":
        return 2 * b * h * act_bytes, "2*b*h*act_bytes (Linear input + ReLU output)"
    return b * h * act_bytes, "b*h*act_bytes (layer input)"


def gpt_saved_bytes(s: int, b: int, h: int, a: int, vocab: int, *, blocks: int, first: bool,
                    last: bool, tp: int = 1, sequence_parallel: bool = False,
                    act_bytes: float = 4, moe_block: float | None = None,
                    cp: int = 1) -> tuple[float, str]:
    """Bytes autograd keeps for one micro-batch on a GPT stage of paralab's model
    (jobs/models/gpt.py with jobs/parallel/tensor.py; no dropout), counted as
    jobs.memory.SavedTensorCounter does: each storage range once, parameters excluded.

    Per block (t = tp; r = t with sequence parallelism, else 1), in elements of act_bytes:
        block input and the residual after attention (LayerNorm inputs)    2*s*b*h/r
        the LayerNorm outputs q/k/v and fc1 read (gathered under SP)       2*s*b*h
        q, k, v, and the attention output read by proj                     4*s*b*h/t
        fc1 output (GELU input) and GELU output (fc2 input)                8*s*b*h/t
        LayerNorm mean and rstd                                            4*s*b/r
        softmax output (read again by att @ v)                             a*b*s^2/t
      plus the causal mask's complement, s^2 bool bytes.
    First stage: token ids b*s and positions s, int64. Last stage: the final LayerNorm
    (input s*b*h/r, mean/rstd 2*s*b/r), the LM head's input s*b*h, log-softmax output s*b*V,
    the int64 targets s*b and NLL's 4-byte total weight. A MoE block (`moe_block`: its bytes,
    jobs.theory.moe.moe_saved_bytes) replaces the dense MLP's fc1 / GELU outputs 8*s*b*h/t.
    Context parallelism (cp > 1: s and b are one CP rank's chunk length seq_len/cp and its
    sequences): ring attention (jobs/parallel/context.py) recomputes the scores in backward and
    keeps instead its output and log-sum-exp, s*b*h/t + a*b*s/t, and no mask (one local head,
    a/t = 1: proj reads that output itself, no copy, and the s*b*h/t is not kept twice)."""
    r = tp if sequence_parallel else 1
    sbh = s * b * h
    if cp > 1:
        attn = act_bytes * ((sbh if a // tp > 1 else 0) + a * b * s) / tp
    else:
        attn = act_bytes * a * b * s * s / tp + s * s
    per_block = act_bytes * (2 * sbh / r + 2 * sbh + 12 * sbh / tp + 4 * s * b / r) + attn
    if moe_block is not None:
        per_block += moe_block - act_bytes * 8 * sbh / tp
    total = blocks * per_block
    if first:
        total += 8 * (b * s + s)
    if last:
        total += act_bytes * (sbh / r + 2 * s * b / r + sbh + s * b * vocab) + 8 * s * b + 4
    mlp = " - 8sbh/t*act + MoE block" if moe_block is not None else ""
    att = "([a/t>1] sbh + a*b*s)/t ring, s = seq_len/cp" if cp > 1 else "a*b*s^2/t) + s^2"
    if cp > 1:
        att = f"{att})"
    return total, (f"blocks x [4*(2sbh/r + 2sbh + 12sbh/t + 4sb/r + {att}{mlp}]"
                   " + first: 8*(b*s + s) + last: 4*(sbh/r + 2sb/r + sbh + s*b*V) + 8sb + 4")
