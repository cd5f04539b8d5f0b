"""Bytes on the wire per rank for one collective: the single place these factors live.

nccl-tests conventions (https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md):
`payload_bytes` is S, the size of the whole logical array of the operation
(for reduce-scatter the unsharded input, for all-gather the gathered output).

    op               bytes sent per rank     busbw factor
    all_reduce       2(n-1)/n * S            2(n-1)/n
    reduce_scatter   (n-1)/n * S             (n-1)/n
    all_gather       (n-1)/n * S             (n-1)/n
    all_to_all       (n-1)/n * S             (n-1)/n
    broadcast        S (root), 0 otherwise   1
    reduce           S (non-root)            1
    send / recv      S / 0                   1

The trace analysis, the theory model and the collective benchmarks all call these functions, so
predicted and measured bytes can only differ by what the ranks really did.
Standard library only.
"""

from __future__ import annotations

from fractions import Fraction

RING_OPS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all")
ROOTED_OPS = ("broadcast", "reduce", "gather", "scatter")
P2P_OPS = ("send", "recv", "send_recv", "isend", "irecv")


def busbw_factor(op: str, n: int) -> Fraction:
    """busbw = algbw * factor (nccl-tests)."""
    if n < 1:
        raise ValueError(f"group size must be >= 1, got {n}")
    if op == "all_reduce":
        return Fraction(2 * (n - 1), n)
    if op in ("reduce_scatter", "all_gather", "all_to_all"):
        return Fraction(n - 1, n)
    if op in ROOTED_OPS or op in P2P_OPS or op == "barrier":
        return Fraction(1)
    raise ValueError(f"unknown collective {op!r}")


def bytes_sent(op: str, payload_bytes: int, n: int, *, is_root: bool = False) -> float:
    """Bytes one rank sends for one op of logical size `payload_bytes` in a group of `n`."""
    if n <= 1 or op == "barrier":
        return 0.0
    if op in RING_OPS:
        return float(busbw_factor(op, n) * payload_bytes)
    if op == "broadcast" or op == "scatter":
        return float(payload_bytes) if is_root else 0.0
    if op == "reduce" or op == "gather":
        return 0.0 if is_root else float(payload_bytes)
    if op in ("send", "isend", "send_recv"):
        return float(payload_bytes)
    if op in ("recv", "irecv"):
        return 0.0
    raise ValueError(f"unknown collective {op!r}")


def bytes_recv(op: str, payload_bytes: int, n: int, *, is_root: bool = False) -> float:
    """Bytes one rank receives: the mirror of `bytes_sent` with the same factors."""
    if n <= 1 or op == "barrier":
        return 0.0
    if op in RING_OPS:
        return bytes_sent(op, payload_bytes, n)
    if op in ("broadcast", "scatter"):
        return 0.0 if is_root else float(payload_bytes)
    if op in ("reduce", "gather"):
        return (n - 1) * float(payload_bytes) if is_root else 0.0
    if op in ("recv", "irecv", "send_recv"):
        return float(payload_bytes)
    if op in ("send", "isend"):
        return 0.0
    raise ValueError(f"unknown collective {op!r}")


def algbw(payload_bytes: int, seconds: float) -> float:
    """Algorithm bandwidth in bytes/s: S / t."""
    return payload_bytes / seconds if seconds > 0 else float("inf")


def busbw(op: str, payload_bytes: int, seconds: float, n: int) -> float:
    """Bus bandwidth in bytes/s: algbw * factor(op, n)."""
    return algbw(payload_bytes, seconds) * float(busbw_factor(op, n))
