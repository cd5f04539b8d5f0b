"""All-reduce (sum) written with point-to-point sends and receives, after seed 000's table.

Every algorithm has the signature `fn(tensor, group=None, tracer=None) -> None` and sums the
tensor over the ranks of `group` in place (the parameter server takes a `placement` keyword as
well). Ranks below are group ranks; messages go to their global ranks. With a tracer, every send
and every receive is recorded as a `comm` record (op `send` / `recv`, `peer` = the peer's rank
in the group, `payload_bytes`, args `algorithm` and `algo_step`, and `placement` for the
parameter server), so per-rank bytes sent and the number of communication steps can be read back
from the trace files alone:

    algorithm          steps          bytes sent (M = tensor bytes, N = ranks reduced over)
    naive              1              (N-1)M per rank, N(N-1)M in total
    ps, dedicated      2 (push, pull) M per worker, NM by the server, 2NM in total
    ps, rank0          2 (push, pull) M per rank > 0, (N-1)M by rank 0, 2(N-1)M in total
    ring               2(N-1)         2(N-1)M/N per rank
    tree (binomial)    2 ceil(log2 N) M per rank > 0 going up, 2(N-1)M in total
    butterfly          log2 N         M log2 N per rank (power-of-two N only)

The sends and receives of a step are issued together (one `batch_isend_irecv`: one NCCL group;
gloo posts them in order and completes them concurrently) and waited for together, and the
patterns are acyclic where a step has only a send or only a receive (parameter server, tree), so
no ordering can deadlock. Results are bitwise identical on all ranks: each algorithm sums every
element once, in one order, and then distributes it.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable

import torch
import torch.distributed as dist

# Ring: chunks travel in segments so that reducing and forwarding one segment overlaps the
# transfer of the next (what gloo's own ring does). Larger segments mean fewer blocking waits,
# which matters on an oversubscribed host: 4 MiB measured best of 1/2/4/unsegmented at 16 MiB.
RING_SEGMENT_BYTES = 4 << 20
# Trace labels (docs/trace-schema.md): the benchmark's ranks are the process group `pg:world`;
# each point-to-point pair is its own sequence-number domain, `pg:world:p2p:<lo>-<hi>`.
AXIS = "pg:world"


def p2p_group(a: int, b: int) -> str:
    """The trace `group` of the point-to-point pair of global ranks a and b."""
    return f"{AXIS}:p2p:{min(a, b)}-{max(a, b)}"


# Receive buffers are views of one cached workspace per (dtype, device), grown on demand: a fresh
# multi-MiB buffer per call costs its page faults (about 1.4 ms for 8 MiB on the dev host), which
# the backend's own all-reduce does not pay. `release_workspace()` frees it.
_WORKSPACE: dict[tuple, torch.Tensor] = {}


def workspace(numel: int, like: torch.Tensor) -> torch.Tensor:
    """A flat scratch tensor of `numel` elements of `like`'s dtype and device (not zeroed). One
    call per algorithm invocation: a second call may return the same memory."""
    key = (like.dtype, like.device)
    buf = _WORKSPACE.get(key)
    if buf is None or buf.numel() < numel:
        buf = _WORKSPACE[key] = torch.empty(numel, dtype=like.dtype, device=like.device)
    return buf[:numel]


def release_workspace() -> None:
    _WORKSPACE.clear()


class _Ctx:
    """Group geometry and trace helpers shared by the algorithms."""

    def __init__(self, algorithm: str, tensor: torch.Tensor, group, tracer, **extra):
        self.algorithm = algorithm
        self.extra = extra
        self.group = group
        self.tracer = tracer
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.elsize = tensor.element_size()

    def glob(self, r: int) -> int:
        return r if self.group is None else dist.get_global_rank(self.group, r)

    def record(self, stack: contextlib.ExitStack, op: str, peer: int, numel: int, step: int):
        if self.tracer is not None:
            stack.enter_context(self.tracer.comm(
                op, payload_bytes=numel * self.elsize, group_size=2, axis=AXIS,
                group=p2p_group(self.glob(self.rank), self.glob(peer)), peer=peer,
                algorithm=self.algorithm, algo_step=step, **self.extra))

    def batch(self, sends: list[tuple[int, torch.Tensor]],
              recvs: list[tuple[int, torch.Tensor]]) -> list:
        """Issue receives and sends as one `batch_isend_irecv` (one NCCL group, so a send and a
        receive between the same pair cannot block each other; gloo issues them in order).
        Empty buffers are skipped (both sides know the sizes). Returns the works."""
        ops = [dist.P2POp(dist.irecv, buf, self.glob(peer), self.group)
               for peer, buf in recvs if buf.numel()]
        ops += [dist.P2POp(dist.isend, buf, self.glob(peer), self.group)
                for peer, buf in sends if buf.numel()]
        return dist.batch_isend_irecv(ops) if ops else []

    def exchange(self, step: int, sends: list[tuple[int, torch.Tensor]],
                 recvs: list[tuple[int, torch.Tensor]]) -> None:
        """Post every receive and send of one step at once, then wait for all of them."""
        with contextlib.ExitStack() as stack:
            for peer, buf in sends:
                self.record(stack, "send", peer, buf.numel(), step)
            for peer, buf in recvs:
                self.record(stack, "recv", peer, buf.numel(), step)
            for w in self.batch(sends, recvs):
                w.wait()


def _flat(tensor: torch.Tensor) -> tuple[torch.Tensor, bool]:
    if tensor.is_contiguous():
        return tensor.view(-1), False
    return tensor.contiguous().view(-1), True


def _inplace(fn):
    """Run `fn` on a flat contiguous view; copy back when the input was not contiguous."""
    @functools.wraps(fn)
    def wrapper(tensor: torch.Tensor, group=None, tracer=None, **kw) -> None:
        flat, copied = _flat(tensor)
        if dist.get_world_size(group) > 1 and flat.numel() > 0:
            fn(flat, group, tracer, **kw)
        if copied:
            tensor.copy_(flat.view_as(tensor))
    return wrapper


@_inplace
def naive(tensor: torch.Tensor, group=None, tracer=None) -> None:
    """Everyone sends its whole vector to everyone else (one step), then sums in rank order."""
    c = _Ctx("naive", tensor, group, tracer)
    others = [r for r in range(c.size) if r != c.rank]
    m = tensor.numel()
    ws = workspace(c.size * m, tensor)
    bufs = {r: ws[j * m:(j + 1) * m] for j, r in enumerate(others)}
    c.exchange(0, [(r, tensor) for r in others], [(r, bufs[r]) for r in others])
    bufs[c.rank] = ws[(c.size - 1) * m:].copy_(tensor)
    tensor.copy_(bufs[0])
    for r in range(1, c.size):
        tensor.add_(bufs[r])


def ps_participants(world: int, placement: str) -> int:
    """Ranks whose vectors are summed: the workers (the dedicated server only serves)."""
    return world - 1 if placement == "dedicated" else world


@_inplace
def parameter_server(tensor: torch.Tensor, group=None, tracer=None, *,
                     placement: str = "dedicated") -> None:
    """Push to the server, which sums in rank order; pull the sum back (two steps).

    `dedicated` (seed 000): the last rank of the group only serves; its input is ignored, and it
    ends up holding the workers' sum like everyone else. Needs at least 3 ranks.
    `rank0` (seed 001): rank 0 serves and contributes its own vector."""
    if placement not in ("dedicated", "rank0"):
        raise ValueError(f"parameter server placement must be 'dedicated' or 'rank0', "
                         f"got {placement!r}")
    c = _Ctx("ps", tensor, group, tracer, placement=placement)
    if placement == "dedicated":
        if c.size < 3:
            raise ValueError(f"dedicated parameter server needs >= 3 ranks (a server and at "
                             f"least two workers), got {c.size}")
        server, workers = c.size - 1, list(range(c.size - 1))
    else:
        server, workers = 0, list(range(1, c.size))
    if c.rank != server:
        c.exchange(0, [(server, tensor)], [])
        c.exchange(1, [], [(server, tensor)])
        return
    m = tensor.numel()
    ws = workspace(len(workers) * m, tensor)
    bufs = [ws[j * m:(j + 1) * m] for j in range(len(workers))]
    c.exchange(0, [], list(zip(workers, bufs, strict=True)))
    if placement == "dedicated":
        tensor.copy_(bufs[0])
        bufs = bufs[1:]
    for b in bufs:
        tensor.add_(b)
    c.exchange(1, [(w, tensor) for w in workers], [])


def chunk_bounds(numel: int, n: int) -> list[tuple[int, int]]:
    """n contiguous chunks, their sizes differing by at most one element."""
    return [(j * numel // n, (j + 1) * numel // n) for j in range(n)]


def _segments(numel: int, seg: int) -> list[tuple[int, int]]:
    """[(lo, hi)] pieces of at most `seg` elements covering range(numel); none when empty."""
    return [(a, min(a + seg, numel)) for a in range(0, numel, seg)]


@_inplace
def ring(tensor: torch.Tensor, group=None, tracer=None) -> None:
    """Reduce-scatter then all-gather around the ring, N-1 steps each (seed 000, seed 001).

    Reduce-scatter step k: rank i sends chunk (i-k) mod N to i+1 and receives chunk
    (i-k-1) mod N from i-1, adding it in. After N-1 steps rank i owns the sum of chunk
    (i+1) mod N. All-gather step k: rank i forwards chunk (i+1-k) mod N and receives chunk
    (i-k) mod N into place. In every step a rank sends the chunk it received in the step before.

    Chunks travel in segments of RING_SEGMENT_BYTES, each step's receives and sends posted
    together. With a tracer, or on a backend other than gloo, the steps run one after another
    (each step one `batch_isend_irecv`), so each step's send and recv records time that step
    alone. Untraced on gloo the ring is pipelined like gloo's own: a segment is forwarded (next
    step's send) as soon as it has arrived and been added, and the next step's receives are
    posted before the current one's are waited for. (Not on NCCL: with two ranks the prefetched
    receive would sit ahead of the send on the pair's stream on both sides.)"""
    c = _Ctx("ring", tensor, group, tracer)
    n = c.size
    bounds = chunk_bounds(tensor.numel(), n)
    seg = max(1, RING_SEGMENT_BYTES // c.elsize)
    if tracer is None and tensor.device.type == "cpu" and "gloo" in str(dist.get_backend(group)):
        _ring_pipelined(c, tensor, bounds, seg)
        return
    i, right, left = c.rank, (c.rank + 1) % n, (c.rank - 1) % n
    scratch = workspace(max(hi - lo for lo, hi in bounds), tensor)
    for t in range(2 * (n - 1)):
        slo, shi = bounds[_ring_sent(i, t, n)]
        rlo, rhi = bounds[_ring_sent(i, t + 1, n)]
        reduce = t < n - 1
        rbuf = scratch[:rhi - rlo] if reduce else tensor[rlo:rhi]
        sbuf = tensor[slo:shi]
        with contextlib.ExitStack() as stack:
            c.record(stack, "send", right, shi - slo, t)
            c.record(stack, "recv", left, rhi - rlo, t)
            works = c.batch([(right, sbuf[a:b]) for a, b in _segments(sbuf.numel(), seg)],
                            [(left, rbuf[a:b]) for a, b in _segments(rbuf.numel(), seg)])
            for w in works:
                w.wait()
        if reduce:
            tensor[rlo:rhi].add_(rbuf)


def _ring_sent(i: int, t: int, n: int) -> int:
    """The chunk rank i sends in ring step t (reduce-scatter, then all-gather); the chunk it
    receives in step t is the one it sends in step t + 1."""
    return (i - t) % n if t < n - 1 else (i + 1 - (t - (n - 1))) % n


def _post(c: _Ctx, peer: int, buf: torch.Tensor, seg: int, *, recv: bool = False) -> list:
    """isend / irecv `buf` in segments; [((lo, hi), work)]."""
    op = dist.irecv if recv else dist.isend
    return [((a, b), op(buf[a:b], c.glob(peer), group=c.group))
            for a, b in _segments(buf.numel(), seg)]


def _ring_pipelined(c: _Ctx, tensor: torch.Tensor, bounds, seg: int) -> None:
    n, i = c.size, c.rank
    right, left = (i + 1) % n, (i - 1) % n
    steps = 2 * (n - 1)
    scratch = workspace(2 * max(hi - lo for lo, hi in bounds), tensor)
    half = scratch.numel() // 2

    def inbox(t):  # reduce-scatter receives into alternating halves of the scratch
        lo, hi = bounds[_ring_sent(i, t + 1, n)]
        return scratch[(t % 2) * half:(t % 2) * half + hi - lo] if t < n - 1 else tensor[lo:hi]

    sends = _post(c, right, tensor.narrow(0, *_lo_len(bounds[i])), seg)
    pending = _post(c, left, inbox(0), seg, recv=True)
    for t in range(steps):
        nxt = _post(c, left, inbox(t + 1), seg, recv=True) if t + 1 < steps else []
        lo, _ = bounds[_ring_sent(i, t + 1, n)]
        box = inbox(t)
        for (a, b), w in pending:
            w.wait()
            if t < n - 1:
                tensor[lo + a:lo + b].add_(box[a:b])
            if t + 1 < steps:
                sends.append(((a, b), dist.isend(tensor[lo + a:lo + b], c.glob(right),
                                                  group=c.group)))
        pending = nxt
    for _, w in sends:
        w.wait()


def _lo_len(bound: tuple[int, int]) -> tuple[int, int]:
    return bound[0], bound[1] - bound[0]


def _log2_ceil(n: int) -> int:
    return max(0, (n - 1).bit_length())


@_inplace
def tree(tensor: torch.Tensor, group=None, tracer=None) -> None:
    """Binomial tree rooted at rank 0: reduce up in ceil(log2 N) steps, broadcast down in as many.

    Up, step k: a rank whose lowest set bit is k sends to rank - 2^k; a rank with its k+1 lowest
    bits zero receives from rank + 2^k (when it exists) and adds. Down: the same pairs in reverse
    order, the lower rank sending the finished sum."""
    c = _Ctx("tree", tensor, group, tracer)
    n, i = c.size, c.rank
    levels = _log2_ceil(n)
    buf = workspace(tensor.numel(), tensor)
    for k in range(levels):
        m = 1 << k
        if i % (2 * m) == m:
            c.exchange(k, [(i - m, tensor)], [])
            break
        if i % (2 * m) == 0 and i + m < n:
            c.exchange(k, [], [(i + m, buf)])
            tensor.add_(buf)
    for j in range(levels):
        m = 1 << (levels - 1 - j)
        if i % (2 * m) == 0 and i + m < n:
            c.exchange(levels + j, [(i + m, tensor)], [])
        elif i % (2 * m) == m:
            c.exchange(levels + j, [], [(i - m, tensor)])


@_inplace
def butterfly(tensor: torch.Tensor, group=None, tracer=None) -> None:
    """Recursive doubling: in step k rank i exchanges its whole vector with rank i XOR 2^k and
    adds (log2 N steps; power-of-two N only). Addition is commutative, so partners stay equal."""
    c = _Ctx("butterfly", tensor, group, tracer)
    n, i = c.size, c.rank
    if n & (n - 1):
        raise ValueError(f"butterfly all-reduce needs a power-of-two number of ranks, got {n}")
    buf = workspace(tensor.numel(), tensor)
    for k in range(n.bit_length() - 1):
        peer = i ^ (1 << k)
        c.exchange(k, [(peer, tensor)], [(peer, buf)])
        tensor.add_(buf)


ALGORITHMS: dict[str, Callable] = {
    "naive": naive, "ps": parameter_server, "ring": ring, "tree": tree, "butterfly": butterfly,
}


def get_algorithm(name: str, *, ps_placement: str = "dedicated") -> Callable:
    """`fn(tensor, group=None, tracer=None)` for an algorithm name of the job spec."""
    if name == "builtin":
        def builtin(tensor, group=None, tracer=None):
            dist.all_reduce(tensor, group=group)
        return builtin
    if name not in ALGORITHMS:
        raise ValueError(f"unknown all-reduce algorithm {name!r}; "
                         f"allowed: builtin, {', '.join(ALGORITHMS)}")
    if name == "ps":
        return functools.partial(parameter_server, placement=ps_placement)
    return ALGORITHMS[name]

