"""Context parallelism's ring-attention traffic (standard library only).

Per transformer block and micro-batch, on one CP rank of a ring of `cp` ranks
(jobs/parallel/context.py, jobs/parallel/cp_comm.py). A rank holds seq_len / cp tokens of each
of its `batch` sequences, so one K (or V, dK, dV) block is

    block = batch * (seq_len / cp) * (hidden / tp) * act_bytes
            (the rank's heads: hidden / tp = local heads * d; tp = 1 without tensor parallelism)

and each ring step sends one block per tensor to the next rank (and receives as much):

    forward    steps 0 .. cp-2 send K and V                 2 * block per step
    backward   steps 0 .. cp-2 send K and V                 2 * block per step
               steps 0 .. cp-1 send the dK and dV accumulators  2 * block per step
               (the last pass brings every accumulator home)

    per block and micro-batch:  sent = received = (2 (cp-1) + 2 (cp-1) + 2 cp) * block
                                                = (6 cp - 4) * block

Convention "ring-p2p": bytes each rank sends (= receives), exact, for the load-balanced causal
split and for any causal layout (the ring passes every block whether or not a pair is skipped).
Activation memory of the local tokens is divided by cp (attention included: no rank holds the
whole sequence's scores). tests/cp checks these against the traced send / recv records.
"""

from __future__ import annotations

CONVENTION = "ring-p2p"


def block_bytes(*, batch: int, seq_len: int, hidden: int, cp: int, act_bytes: int = 4,
                tp: int = 1) -> int:
    """One K / V / dK / dV block one CP rank holds: batch * seq_len/cp * hidden/tp * act_bytes."""
    if cp < 1 or seq_len % (2 * cp):
        raise ValueError(f"seq_len = {seq_len} must be divisible by 2*cp = {2 * cp}")
    if tp < 1 or hidden % tp:
        raise ValueError(f"tp = {tp} must divide hidden = {hidden}")
    return batch * (seq_len // cp) * (hidden // tp) * act_bytes


def ring_step_bytes(*, batch: int, seq_len: int, hidden: int, cp: int, phase: str,
                    cp_step: int, act_bytes: int = 4, tp: int = 1) -> dict:
    """{"k", "v", "dk", "dv"} bytes one rank sends at ring step `cp_step` of `phase`."""
    if not 0 <= cp_step < cp:
        raise ValueError(f"cp_step = {cp_step} outside 0..{cp - 1}")
    if phase not in ("fwd", "bwd"):
        raise ValueError(f"phase must be 'fwd' or 'bwd', got {phase!r}")
    b = block_bytes(batch=batch, seq_len=seq_len, hidden=hidden, cp=cp, act_bytes=act_bytes,
                    tp=tp)
    kv = b if cp_step < cp - 1 else 0
    out = {"k": kv, "v": kv}
    if phase == "bwd":
        out.update(dk=b, dv=b)
    return out


def ring_bytes(*, batch: int, seq_len: int, hidden: int, cp: int, act_bytes: int = 4,
               tp: int = 1) -> dict:
    """Per block and micro-batch on one rank: bytes sent (= received) forward, backward, total."""
    b = block_bytes(batch=batch, seq_len=seq_len, hidden=hidden, cp=cp, act_bytes=act_bytes,
                    tp=tp)
    fwd = 2 * (cp - 1) * b
    bwd = 2 * (cp - 1) * b + 2 * cp * b
    return {"block": b, "fwd": fwd, "bwd": bwd, "total": fwd + bwd,
            "formula": "(6 cp - 4) * batch * seq_len/cp * hidden/tp * act_bytes",
            "convention": CONVENTION}


def step_ring_bytes(*, layers: int, rounds: int, micro_batch: int, seq_len: int, hidden: int,
                    cp: int, act_bytes: int = 4, tp: int = 1) -> int:
    """One training step on one rank: every block it holds (`layers`: the pipeline stage's
    under pp), every micro-batch / accumulation round."""
    per = ring_bytes(batch=micro_batch, seq_len=seq_len, hidden=hidden, cp=cp,
                     act_bytes=act_bytes, tp=tp)["total"]
    return layers * rounds * per
