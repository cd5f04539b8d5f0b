"""Capture the collectives PyTorch's own components issue from Python (FSDP2's all-gather /
reduce-scatter, ZeroRedundancyOptimizer's broadcasts, ...) as trace records.

While `capture(tracer, ...)` is active, the public `torch.distributed` collectives are wrapped:
each call becomes a comm record with its logical payload (nccl-tests convention), and async
work is timed to the completion of its future. Internals that call each other inside
`distributed_c10d` resolve the unwrapped functions, so nothing is counted twice. DDP's reducer
issues its all-reduces from C++; the native DDP strategy records those with a communication
hook (jobs/parallel/native.py). tests/jobs/test_trace.py checks the counts per op against the
profiler's `gloo:*` events, an independent source.
"""

from __future__ import annotations

import contextlib
import threading

import torch
import torch.distributed as dist


def _nbytes(t) -> int:
    if isinstance(t, torch.Tensor):
        return t.numel() * t.element_size()
    if isinstance(t, (list, tuple)):
        return sum(_nbytes(x) for x in t)
    return 0


def _root_rank(group, src):
    try:
        return dist.get_group_rank(group or dist.group.WORLD, src)
    except (ValueError, RuntimeError):
        return src


# name -> (logical op, payload(args, kwargs) -> bytes, root/peer argument name or None)
_SPECS = {
    "all_reduce": ("all_reduce", lambda a, k: _nbytes(a[0] if a else k["tensor"]), None),
    "broadcast": ("broadcast", lambda a, k: _nbytes(a[0] if a else k["tensor"]), "src"),
    "all_gather_into_tensor": ("all_gather", lambda a, k: _nbytes(a[0] if a else
                                                                  k["output_tensor"]), None),
    "all_gather_single": ("all_gather", lambda a, k: _nbytes(a[0] if a else
                                                             k["output_tensor"]), None),
    "all_gather": ("all_gather", lambda a, k: _nbytes(a[0] if a else k["tensor_list"]), None),
    "reduce_scatter_tensor": ("reduce_scatter", lambda a, k: _nbytes(a[1] if len(a) > 1 else
                                                                     k["input"]), None),
    "reduce_scatter_single": ("reduce_scatter", lambda a, k: _nbytes(a[1] if len(a) > 1 else
                                                                     k["input"]), None),
    "reduce_scatter": ("reduce_scatter", lambda a, k: _nbytes(a[1] if len(a) > 1 else
                                                              k["input_list"]), None),
    "reduce": ("reduce", lambda a, k: _nbytes(a[0] if a else k["tensor"]), "dst"),
    "send": ("send", lambda a, k: _nbytes(a[0] if a else k["tensor"]), "dst"),
    "recv": ("recv", lambda a, k: _nbytes(a[0] if a else k["tensor"]), "src"),
}
# isend / irecv stay unwrapped: P2POp checks their identity (distributed_c10d._check_op), so a
# wrapper would break batch_isend_irecv (pipelining's p2p); their callers trace them instead.
_ARGPOS = {"src": 1, "dst": 1}
ORIGINAL = {k: getattr(dist, k) for k in _SPECS if hasattr(dist, k)}  # unwrapped, for hooks
_lock = threading.Lock()
_active: list = []


def _wrap(name: str, fn, tracer, axis_of):
    op, payload_of, role = _SPECS[name]

    def wrapped(*args, **kwargs):
        group = kwargs.get("group")
        if group is None and name in ("all_reduce", "all_gather_into_tensor",
                                      "all_gather_single", "reduce_scatter_tensor",
                                      "reduce_scatter_single") and len(args) > 2:
            group = next((a for a in args[2:] if isinstance(a, dist.ProcessGroup)), None)
        pg = group or dist.group.WORLD
        axis = axis_of(pg)
        if axis is None:  # a group someone else traces (pipelining's p2p): pass through
            return fn(*args, **kwargs)
        n = dist.get_world_size(pg)
        extra, is_root = {}, False
        if role is not None:
            who = kwargs.get(role, args[_ARGPOS[role]] if len(args) > _ARGPOS[role] else None)
            if who is None:
                who = kwargs.get("group_" + role)
            else:
                who = _root_rank(group, who)
            me = dist.get_rank(pg)
            if op in ("broadcast", "reduce"):
                is_root = who == me
            else:
                extra["peer"] = who
        if kwargs.get("async_op"):
            extra["async"] = True
        h = tracer.comm_start(op, payload_bytes=payload_of(args, kwargs), group_size=n,
                              axis=axis, group=axis if "peer" not in extra else
                              f"{axis}:p2p", is_root=is_root, source=f"torch.distributed.{name}",
                              device=False, **extra)
        work = fn(*args, **kwargs)
        if not hasattr(work, "get_future"):  # blocking call: None, or recv's sender rank
            h.done()
            return work
        try:
            work.get_future().then(lambda _f: h.done())
        except RuntimeError:  # no future on this backend/op: completion observed at issue
            h.done(end="issue")
        return work

    return wrapped


@contextlib.contextmanager
def capture(tracer, axis_names: dict | None = None, *, only_named: bool = False):
    """Record every public torch.distributed collective called inside the block.
    `axis_names` maps process groups to axis names ("dp", ...); others are named by group, or,
    with `only_named`, not recorded (their owner traces them, e.g. the pipeline's p2p)."""
    names = {id(g): a for g, a in (axis_names or {}).items()}

    def axis_of(pg) -> str | None:
        if only_named:
            return names.get(id(pg))
        return names.get(id(pg), f"pg:{getattr(pg, 'group_name', '?')}")

    with _lock:
        if not _active:
            for k, fn in ORIGINAL.items():
                setattr(dist, k, _wrap(k, fn, tracer, axis_of))
        _active.append(tracer)
    try:
        yield
    finally:
        with _lock:
            _active.pop()
            if not _active:
                for k, fn in ORIGINAL.items():
                    setattr(dist, k, fn)
