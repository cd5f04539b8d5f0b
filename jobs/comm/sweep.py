"""One point of a collective sweep: sizes, buffers, timing, verification, copy bandwidth.

A point is (op, algorithm, bytes). Every rank builds the same `Case`: deterministic inputs whose
values are small integers (exact in every element type, bf16 included, so results are compared
for equality, not closeness), a `reset` that restores the inputs, a `run`, and a `check` against
the expected result. All-reduce algorithms written with point-to-point messages are checked
against the backend's own `all_reduce` of the same inputs.

Bandwidths follow nccl-tests (jobs.commbytes is the one place the factors live): S is the whole
logical array of the op, algbw = S / t, busbw = algbw * factor(op, n), with t the mean time over
ranks and timed iterations.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from jobs import commbytes
from jobs.comm import allreduce
from jobs.comm.allreduce import AXIS, p2p_group

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "float64": torch.float64, "int32": torch.int32}
SHARDED_OPS = ("reduce_scatter", "all_gather", "all_to_all")
ROOT = 0
# torch 2.13 renamed the tensor-in / tensor-out forms (the old names warn).
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def sweep_sizes(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    """nccl-tests -b MIN -e MAX -f FACTOR: MIN, MIN*F, MIN*F^2, ... up to and including MAX."""
    if min_bytes < 1 or max_bytes < min_bytes or factor < 2:
        raise ValueError(f"bad sweep: min {min_bytes}, max {max_bytes}, factor {factor}")
    out, s = [], min_bytes
    while s <= max_bytes:
        out.append(s)
        s *= factor
    return out


def element_count(op: str, nbytes: int, elsize: int, n: int) -> int:
    """Elements of the whole array S for a requested size: whole elements, and a multiple of n
    for the ops that split the array into n shards (as nccl-tests rounds its counts)."""
    count = max(1, nbytes // elsize)
    if op in SHARDED_OPS:
        count = max(n, count - count % n)
    return count


# The largest integer up to which every integer is exact in the type: sums of the inputs stay
# exact (so any summation order gives the same bits) while they stay below it.
EXACT_INT = {torch.float32: 1 << 24, torch.bfloat16: 256, torch.float16: 2048,
             torch.float64: 1 << 53, torch.int32: (1 << 31) - 1}


def value_span(dtype: torch.dtype, n: int) -> int:
    """Inputs take values 1..span: 11, or fewer so that a sum over n ranks stays exact
    (bfloat16 from 24 ranks on; beyond 256 ranks bfloat16 sums cannot be exact at all)."""
    return max(1, min(11, EXACT_INT[dtype] // max(1, n)))


def pattern(rank: int, numel: int, dtype: torch.dtype, device, span: int = 11) -> torch.Tensor:
    """Rank `rank`'s input: integers 1..span, different per rank and position, exact in any
    dtype; with span = value_span(dtype, n) their sum over n ranks is exact too."""
    i = torch.arange(numel, dtype=torch.int64, device=device)
    return ((i * 7 + rank * 3) % span + 1).to(dtype)


def pattern_sum(ranks, numel: int, dtype: torch.dtype, device, span: int = 11) -> torch.Tensor:
    acc = torch.zeros(numel, dtype=torch.int64, device=device)
    for r in ranks:
        acc += pattern(r, numel, torch.int64, device, span)
    return acc.to(dtype)


@dataclass
class Case:
    """One point, built identically on every rank."""

    op: str
    algorithm: str
    count: int
    nbytes: int  # S, the whole logical array (nccl-tests)
    n: int  # ranks the busbw factor counts (workers only for a dedicated parameter server)
    reset: Callable[[], None]
    run: Callable[[object], None]  # run(tracer or None)
    check: Callable[[], bool]


def _traced(tracer, op: str, nbytes: int, n: int, **kw):
    if tracer is None:
        return contextlib.nullcontext()
    return tracer.comm(op, payload_bytes=nbytes, group_size=n, axis=AXIS, **kw)


def make_case(op: str, algorithm: str, nbytes: int, dtype: torch.dtype, device, *,
              group=None, ps_placement: str = "dedicated") -> Case:
    """Buffers and closures for one (op, algorithm, requested bytes) point on this rank."""
    rank, n = dist.get_rank(group), dist.get_world_size(group)
    elsize = torch.empty((), dtype=dtype).element_size()
    count = element_count(op, nbytes, elsize, n)
    S = count * elsize
    span = value_span(dtype, n)
    if op == "all_reduce" and algorithm != "builtin":
        return _algorithm_case(algorithm, ps_placement, count, S, dtype, device, group, rank, n,
                               span)
    if algorithm != "builtin":
        raise ValueError(f"algorithm {algorithm!r} only applies to all_reduce, not {op}")
    mine = pattern(rank, count, dtype, device, span)
    work = torch.empty_like(mine)

    def reset():
        work.copy_(mine)

    if op == "all_reduce":
        expected = pattern_sum(range(n), count, dtype, device, span)

        def run(tr):
            with _traced(tr, op, S, n, algorithm="builtin"):
                dist.all_reduce(work, group=group)
        return Case(op, algorithm, count, S, n, reset, run, lambda: torch.equal(work, expected))

    c = count // n if op in SHARDED_OPS else count
    lo, hi = rank * c, (rank + 1) * c
    if op == "reduce_scatter":  # in place: the output is this rank's shard of the input
        expected = pattern_sum(range(n), count, dtype, device, span)[lo:hi]

        def run(tr):
            with _traced(tr, op, S, n, algorithm="builtin"):
                _reduce_scatter(work[lo:hi], work, group=group)
        return Case(op, algorithm, count, S, n, reset, run,
                    lambda: torch.equal(work[lo:hi], expected))
    if op == "all_gather":  # in place: the input is this rank's shard of the output
        expected = torch.cat([pattern(r, count, dtype, device, span)[r * c:(r + 1) * c]
                              for r in range(n)])

        def reset():  # noqa: F811 - all_gather starts from zeros outside this rank's shard
            work.zero_()
            work[lo:hi].copy_(mine[lo:hi])

        def run(tr):
            with _traced(tr, op, S, n, algorithm="builtin"):
                _all_gather(work, work[lo:hi], group=group)
        return Case(op, algorithm, count, S, n, reset, run, lambda: torch.equal(work, expected))
    if op == "all_to_all":  # out of place: shard j of the output comes from rank j
        expected = torch.cat([pattern(r, count, dtype, device, span)[lo:hi] for r in range(n)])
        out = torch.empty_like(mine)

        def reset():  # noqa: F811
            out.zero_()

        def run(tr):
            with _traced(tr, op, S, n, algorithm="builtin"):
                dist.all_to_all_single(out, mine, group=group)
        return Case(op, algorithm, count, S, n, reset, run, lambda: torch.equal(out, expected))
    groot = ROOT if group is None else dist.get_global_rank(group, ROOT)
    if op == "broadcast":
        expected = pattern(ROOT, count, dtype, device, span)

        def run(tr):
            with _traced(tr, op, S, n, is_root=rank == ROOT, algorithm="builtin"):
                dist.broadcast(work, groot, group=group)
        return Case(op, algorithm, count, S, n, reset, run, lambda: torch.equal(work, expected))
    if op == "reduce":
        expected = pattern_sum(range(n), count, dtype, device, span)

        def run(tr):
            with _traced(tr, op, S, n, is_root=rank == ROOT, algorithm="builtin"):
                dist.reduce(work, groot, group=group)
        return Case(op, algorithm, count, S, n, reset, run,
                    lambda: rank != ROOT or torch.equal(work, expected))
    if op == "send_recv":  # nccl-tests sendrecv: send to rank+1, receive from rank-1 at once
        return _send_recv_case(count, S, dtype, device, group, rank, n, mine, span)
    raise ValueError(f"unknown collective {op!r}")


def _send_recv_case(count, S, dtype, device, group, rank, n, mine, span) -> Case:
    right, left = (rank + 1) % n, (rank - 1) % n
    expected = pattern(left, count, dtype, device, span)
    out = torch.empty_like(mine)

    def glob(r):
        return r if group is None else dist.get_global_rank(group, r)

    def reset():
        out.zero_()

    def run(tr):
        if n == 1:
            out.copy_(mine)
            return
        with contextlib.ExitStack() as st:
            if tr is not None:
                st.enter_context(tr.comm("send", payload_bytes=S, group_size=2, axis=AXIS,
                                         group=p2p_group(glob(rank), glob(right)), peer=right,
                                         algorithm="builtin"))
                st.enter_context(tr.comm("recv", payload_bytes=S, group_size=2, axis=AXIS,
                                         group=p2p_group(glob(rank), glob(left)), peer=left,
                                         algorithm="builtin"))
            works = dist.batch_isend_irecv([dist.P2POp(dist.irecv, out, glob(left), group),
                                            dist.P2POp(dist.isend, mine, glob(right), group)])
            for w in works:
                w.wait()
    return Case("send_recv", "builtin", count, S, n, reset, run,
                lambda: torch.equal(out, expected))


def _algorithm_case(algorithm, ps_placement, count, S, dtype, device, group, rank, n,
                    span) -> Case:
    fn = allreduce.get_algorithm(algorithm, ps_placement=ps_placement)
    # the ranks whose vectors are summed: a dedicated server (the last rank) only serves, and
    # its input is zeros so that the backend's all-reduce over every rank is the reference
    ranks = list(range(allreduce.ps_participants(n, ps_placement) if algorithm == "ps" else n))
    mine = pattern(rank, count, dtype, device, span) if rank in ranks else \
        torch.zeros(count, dtype=dtype, device=device)
    expected = mine.clone()
    dist.all_reduce(expected, group=group)  # the backend's own all-reduce is the reference
    if not torch.equal(expected, pattern_sum(ranks, count, dtype, device, span)):
        raise RuntimeError(f"the backend's all_reduce of {S} bytes disagrees with the "
                           "expected sum: the reference itself is wrong")
    work = torch.empty_like(mine)

    def reset():
        work.copy_(mine)

    def run(tr):
        if tr is None:
            fn(work, group=group)
            return
        with tr.span(f"all_reduce:{algorithm}", cat="bench", algorithm=algorithm,
                     payload_bytes=S):
            fn(work, group=group, tracer=tr)
    return Case("all_reduce", algorithm, count, S, len(ranks), reset, run,
                lambda: torch.equal(work, expected))


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def time_case(case: Case, *, warmup: int, iters: int, check: bool, device, ctrl=None,
              tracer=None) -> tuple[list[float], bool | None]:
    """One traced iteration, `warmup` untimed and `iters` timed ones, each from fresh inputs and
    after a barrier. Returns this rank's timed seconds and whether every checked result was
    right (None when `check` is off)."""
    ok = True
    case.reset()
    dist.barrier(group=ctrl)
    case.run(tracer)
    _sync(device)
    if check:
        ok = case.check()
    times = []
    for it in range(warmup + iters):
        case.reset()
        _sync(device)
        dist.barrier(group=ctrl)
        t0 = time.perf_counter()
        case.run(None)
        _sync(device)
        t1 = time.perf_counter()
        if it >= warmup:
            times.append(t1 - t0)
        if check:
            ok = case.check() and ok
    return times, (ok if check else None)


def copy_bandwidth(nbytes: int, device, reps: int = 5) -> float:
    """Bytes per second of one local `dst.copy_(src)` of `nbytes` (best of `reps`, after a
    warm-up): the ceiling a transfer on this host (or, on CUDA, device) could reach."""
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    best = float("inf")
    for i in range(reps + 1):
        _sync(device)
        t0 = time.perf_counter()
        dst.copy_(src)
        _sync(device)
        dt = time.perf_counter() - t0
        if i:
            best = min(best, dt)
    return commbytes.algbw(nbytes, best)


def summarize(op: str, S: int, n: int, all_times_s: list[float],
              copy_Bps: float | None = None) -> dict:
    """Time statistics over ranks and iterations, and nccl-tests' algbw / busbw in GB/s."""
    mean = sum(all_times_s) / len(all_times_s)
    row = {"time_us_min": min(all_times_s) * 1e6, "time_us_mean": mean * 1e6,
           "time_us_max": max(all_times_s) * 1e6,
           "algbw_GBps": commbytes.algbw(S, mean) / 1e9,
           "busbw_GBps": commbytes.busbw(op, S, mean, n) / 1e9}
    row["busbw_frac_of_copy"] = (row["busbw_GBps"] * 1e9 / copy_Bps) if copy_Bps else None
    return row
