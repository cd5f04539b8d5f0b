"""Communication volume per rank per step (no torch). Byte factors come from jobs.commbytes only.

Conventions (explicit input `comm_convention`, shown with every number):

    ring-exact     (default) bytes each rank sends, nccl-tests factors: DDP all-reduce
                   2(N-1)/N*G; ZeRO-1/2 reduce-scatter G + all-gather P = the same; ZeRO-3
                   all-gather P twice + reduce-scatter G = 1.5x that (seed 001, seed 004, and
                   seed 000 Q7). The collectives are listed op by op (`dp_collectives`) so the
                   trace analysis can compare op by op with `commbytes.bytes_sent`.
    asymptotic     the N -> infinity limit the seeds quote: 2Ψ for DDP/ZeRO-1/2, 3Ψ for ZeRO-3
                   (seed 001 "2φ / 3φ", seed 004 "2x / 3x #params").
    seed000-table  seed 000's comparison table: 2M baseline, 4M for every ZeRO stage (it counts
                   the all-gather like an all-reduce); kept only to reproduce that table.

G and P are the gradient and parameter payloads in bytes (elements x `grad_bytes`).
"""

from __future__ import annotations

import math

from jobs import commbytes

COMM_CONVENTIONS = ("ring-exact", "asymptotic", "seed000-table")
ALGORITHMS = ("naive", "ps-dedicated", "ps-rank0", "ring", "tree", "butterfly")


def dp_collectives(payload_bytes: float, n: int, zero_stage: int, dp_mode: str = "ddp") -> list:
    """The data-parallel collectives of one step: [(op, payload_bytes, group_size, count)]."""
    if n <= 1:
        return []
    if dp_mode == "ps":
        # parameter server on rank 0 (seed 001): workers send G, the server sends P to each
        return [("send", payload_bytes, n, 1)]
    if zero_stage == 0:
        return [("all_reduce", payload_bytes, n, 1)]
    if zero_stage in (1, 2):
        return [("reduce_scatter", payload_bytes, n, 1), ("all_gather", payload_bytes, n, 1)]
    return [("all_gather", payload_bytes, n, 2), ("reduce_scatter", payload_bytes, n, 1)]


def dp_bytes_per_rank(psi: float, n: int, zero_stage: int, grad_bytes: float,
                      dp_mode: str = "ddp", convention: str = "ring-exact") -> dict:
    """Bytes one data-parallel rank sends per step (the busiest rank for a parameter server)."""
    if convention not in COMM_CONVENTIONS:
        raise ValueError(f"comm convention must be one of {', '.join(COMM_CONVENTIONS)}")
    payload = psi * grad_bytes
    inputs = {"Ψ": psi, "N": n, "grad_bytes": grad_bytes, "zero_stage": zero_stage,
              "dp_mode": dp_mode}
    if n <= 1:
        return {"value": 0.0, "formula": "0 (no data parallelism)", "inputs": inputs, "ops": []}
    if dp_mode == "ps":
        server = (n - 1) * commbytes.bytes_sent("send", payload, n)
        return {"value": server, "formula": "(N-1)*Ψ*grad_bytes (rank-0 server broadcasts "
                "updated parameters; each worker sends Ψ*grad_bytes)", "inputs": inputs,
                "ops": [("send", payload, n, n - 1)],
                "per_role": {"server": server, "worker": commbytes.bytes_sent("send", payload,
                                                                              n)}}
    if convention == "asymptotic":
        k = 3 if zero_stage == 3 else 2
        return {"value": k * payload, "formula": f"{k}*Ψ*grad_bytes (N -> inf limit)",
                "inputs": inputs, "ops": []}
    if convention == "seed000-table":
        k = 2 if zero_stage == 0 else 4
        return {"value": k * payload, "formula": f"{k}*M, M = Ψ*grad_bytes (seed 000 table)",
                "inputs": inputs, "ops": []}
    ops = dp_collectives(payload, n, zero_stage, dp_mode)
    value = sum(commbytes.bytes_sent(op, s, g) * c for op, s, g, c in ops)
    formula = {0: "2(N-1)/N*Ψ*grad_bytes (all-reduce)",
               1: "(N-1)/N*Ψ*b (reduce-scatter) + (N-1)/N*Ψ*b (all-gather) = 2(N-1)/N*Ψ*b",
               2: "(N-1)/N*Ψ*b (reduce-scatter) + (N-1)/N*Ψ*b (all-gather) = 2(N-1)/N*Ψ*b",
               3: "2*(N-1)/N*Ψ*b (all-gather fwd+bwd) + (N-1)/N*Ψ*b (reduce-scatter) "
                  "= 3(N-1)/N*Ψ*b = 1.5x DDP"}[zero_stage]
    return {"value": value, "formula": formula, "inputs": inputs, "ops": ops}


def _log2(n: int) -> int:
    return max(1, math.ceil(math.log2(n))) if n > 1 else 0


def allreduce_algorithms(n: int, M: float) -> list[dict]:
    """Seed 000's table for an all-reduce of M (elements or bytes) over n workers.

    total_volume: what all workers send together (exact); table_volume: the seed's column
    (2NM where it writes the approximation); steps; max_per_worker: what the busiest worker
    sends; bottleneck."""
    if n < 1:
        raise ValueError("n must be >= 1")
    lg = _log2(n)
    ring_pw = commbytes.bytes_sent("all_reduce", M, n)
    rows = [
        {"algorithm": "ps-dedicated", "total_volume": 2 * n * M, "table_volume": 2 * n * M,
         "total_formula": "2NM (N workers push M, the server sends M to each)", "steps": 2,
         "max_per_worker": n * M, "bottleneck": "server (sends and receives N*M)"},
        {"algorithm": "ps-rank0", "total_volume": 2 * (n - 1) * M, "table_volume": 2 * n * M,
         "total_formula": "2(N-1)M (rank 0 serves; seed 001)", "steps": 2,
         "max_per_worker": (n - 1) * M, "bottleneck": "rank 0 (sends and receives (N-1)M)"},
        {"algorithm": "naive", "total_volume": n * (n - 1) * M, "table_volume": n * (n - 1) * M,
         "total_formula": "N(N-1)M", "steps": 1, "max_per_worker": (n - 1) * M,
         "bottleneck": "quadratic scaling"},
        {"algorithm": "ring", "total_volume": n * ring_pw, "table_volume": 2 * n * M,
         "total_formula": "2(N-1)M ≈ 2NM", "steps": 2 * (n - 1), "max_per_worker": ring_pw,
         "bottleneck": "balanced"},
        {"algorithm": "tree", "total_volume": 2 * (n - 1) * M, "table_volume": 2 * n * M,
         "total_formula": "(N-1)M reduce + (N-1)M broadcast = 2(N-1)M ≈ 2NM", "steps": 2 * lg,
         "max_per_worker": lg * M, "bottleneck": "root (binomial tree: log2 N sends of M)"},
        {"algorithm": "butterfly", "total_volume": n * M * lg, "table_volume": n * M * lg,
         "total_formula": "N*M*log2 N", "steps": lg, "max_per_worker": lg * M,
         "bottleneck": "balanced (needs N a power of two)"},
    ]
    if n == 1:
        for r in rows:
            r.update(total_volume=0.0, table_volume=0.0, max_per_worker=0.0, steps=0)
    return rows


def tp_bytes_per_microbatch(s: int, b: int, h: int, layers: int, tp: int, act_bytes: float,
                            sequence_parallel: bool = False, checkpointing: bool = False) -> dict:
    """Megatron TP, per rank per micro-batch: per block 2 all-reduces forward + 2 backward of
    b*s*h elements; with SP each all-reduce becomes an all-gather + a reduce-scatter (4 + 4 per
    block, the same bytes; Korthikanti et al. 2022).

    Activation checkpointing of whole blocks recomputes each block's forward in backward, with
    its collectives, but torch's non-reentrant checkpoint stops the recomputation once the
    tensors backward needs exist (early stop, the default): the block's last collective (the
    MLP's output all-reduce / reduce-scatter) is not repeated. Recomputed per block: 1
    all-reduce; with SP 2 all-gathers + 1 reduce-scatter (`recompute_value`, in `value`)."""
    payload = s * b * h * act_bytes
    if tp <= 1:
        return {"value": 0.0, "formula": "0 (no tensor parallelism)", "ops": [],
                "recompute_value": 0.0}
    if sequence_parallel:
        ops = [("all_gather", payload, tp, 4 * layers), ("reduce_scatter", payload, tp,
                                                         4 * layers)]
        redo = [("all_gather", payload, tp, 2 * layers), ("reduce_scatter", payload, tp, layers)]
        formula = "layers*8*(t-1)/t*s*b*h*act_bytes (4 all-gather + 4 reduce-scatter per block)"
        extra = " + layers*3*(t-1)/t*s*b*h*act_bytes recomputed (2 all-gather + 1 reduce-scatter)"
    else:
        ops = [("all_reduce", payload, tp, 4 * layers)]
        redo = [("all_reduce", payload, tp, layers)]
        formula = "layers*4*2(t-1)/t*s*b*h*act_bytes (2 fwd + 2 bwd all-reduce per block)"
        extra = " + layers*2(t-1)/t*s*b*h*act_bytes recomputed (1 all-reduce per block)"
    if not checkpointing:
        redo, extra = [], ""
    again = sum(commbytes.bytes_sent(op, sz, g) * c for op, sz, g, c in redo)
    value = sum(commbytes.bytes_sent(op, sz, g) * c for op, sz, g, c in ops) + again
    return {"value": value, "formula": formula + extra, "ops": ops + redo,
            "recompute_value": again}


def pp_bytes_per_microbatch(act_elems: float, act_bytes: float, pp: int, v: int) -> dict:
    """Busiest pipeline rank, per micro-batch: each of its stages sends its output activation
    forward (unless last) and the input gradient backward (unless first)."""
    payload = act_elems * act_bytes
    if pp <= 1:
        return {"value": 0.0, "formula": "0 (no pipeline parallelism)", "ops": []}
    best = 0
    for r in range(pp):
        sends = 0
        for c in range(v):
            st = c * pp + r
            sends += (st < pp * v - 1) + (st > 0)
        best = max(best, sends)
    value = best * commbytes.bytes_sent("send", payload, 2)
    return {"value": value, "formula": f"{best} sends x activation bytes (forward output + "
            "backward input-gradient of each stage on the busiest rank)",
            "ops": [("send", payload, 2, best)]}
