"""The tracer: per-rank spans, communication records and memory samples as JSON lines.

One `Tracer` per rank writes `trace-rank{R}.jsonl` (schema: docs/trace-schema.md). Records are
buffered in memory and written by a daemon thread every `flush_interval_s`, on `flush()`,
`close()`, SIGTERM/SIGINT and at interpreter exit, so a run that is cancelled, times out or hangs
inside a collective (where Python signal handlers cannot run) keeps its trace up to the last
fraction of a second: each rank's last completed collective per group is on disk. Beside the
lines the flusher writes the same records column by column, `trace-rank{R}.blocks`
(jobs/trace_blocks.py, a block per few thousand records and one at close), what the worker's
Parquet conversion reads instead of parsing the lines while the two are twins.

Times are integers in ns on an aligned clock: this rank's monotonic clock shifted onto rank 0's
wall clock. The shift is measured with ping-pongs against rank 0 (Cristian's algorithm, best of
several); the bound on its error (half the best round trip) goes into the `meta` record as
`clock_error_ns`. On CUDA, `span(..., device=True)` and `comm(...)` time device work with CUDA
events, resolved to the same clock at flush time.

Bytes: every communication record carries the op and its logical payload S (nccl-tests
convention); `bytes_sent` / `bytes_recv` are derived from it here, once, with the factors in
`jobs.commbytes`. Where the backend moves more than the logical op needs (gloo runs
reduce-scatter as a full all-reduce) the record also names `backend_op` and its bytes.

Flight recorder (jobs/flight.py; docs/faults.md): a ring of the last collectives (spec
`trace.flight_entries`) in PyTorch's flight-recorder format, each with its issuing stack, and per
process group what was issued and completed, written as `flight/flight_rank_{R}` (torch's dump)
and `flight-rank{R}.json` (paralab's view of it) by the flusher thread whenever it changed (the
dump waits up to flight.DUMP_EVERY_S and the view flight.VIEW_EVERY_S while the ring moves),
even while the main thread is blocked inside a collective. `last_progress_ns` (the last
completed collective or step) is what the worker's hang detector reads.

Bounded tracing (jobs/trace_schedule.py): `begin_step` decides per step whether the step is
traced in detail (`enabled`). On an untraced step `span`, `comm_start` and `memory` write
nothing and take no CUDA events, but the step span is still timed (the loop's step times), a
completed step and every completed collective still advance `last_progress_ns` and the flight
recorder, and `comm_totals` / `comm_by_step` still count every collective of the run (the
summary's formula checks cover all steps). `scalars` writes the one compact record every step
gets whatever the schedule.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import signal
import threading
import time
import weakref
from pathlib import Path

from jobs import commbytes, trace_blocks
from jobs.flight import FlightRecorder, frames_here
from jobs.trace_schedule import (
    DETAIL_TYPES,
    NO_SAMPLES,
    is_scheduled,
    keeps_span,
    max_records,
)

SCHEMA_VERSION = 2  # 2: bounded tracing (untraced steps, `scalars` records)
_ENCODER = json.JSONEncoder(default=str, separators=(",", ":"))

# What the backend actually runs for a logical op (only where it differs from the logical op).
BACKEND_OPS = {"gloo": {"reduce_scatter": "all_reduce"}}

_LIVE: weakref.WeakSet = weakref.WeakSet()
_HANDLERS_INSTALLED = False


@functools.lru_cache(maxsize=4096)
def _bytes(op: str, payload: int, n: int, is_root: bool) -> tuple[float, float]:
    """(sent, received) for one op, cached: steps repeat the same sizes (Fractions are slow)."""
    return (commbytes.bytes_sent(op, payload, n, is_root=is_root),
            commbytes.bytes_recv(op, payload, n, is_root=is_root))


_STATM: list = []
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _pg_timeout_ms() -> int:
    """The process groups' default timeout (the flight entries' `timeout_ms`)."""
    try:
        from torch.distributed.constants import default_pg_timeout
        return int(default_pg_timeout.total_seconds() * 1000)
    except ImportError:  # pragma: no cover
        return 0


def _rss_bytes() -> int:
    """Resident set size now (one pread on a kept-open /proc/self/statm)."""
    try:
        if not _STATM or _STATM[0][1] != os.getpid():
            _STATM[:] = [(os.open("/proc/self/statm", os.O_RDONLY), os.getpid())]
        return int(os.pread(_STATM[0][0], 128, 0).split()[1]) * _PAGE
    except OSError:  # pragma: no cover - non-Linux
        return 0


_PREVIOUS: dict = {}


def _on_signal(signum, frame):  # pragma: no cover - exercised by the SIGTERM test in a child
    for t in list(_LIVE):
        if t._closed:  # still live: the signal came inside its close(), on this same thread
            t.rewrite_flight()
        else:
            t.close(reason=signal.Signals(signum).name)
    prev = _PREVIOUS.get(signum)
    if callable(prev):  # e.g. Python's SIGINT handler: KeyboardInterrupt as usual
        signal.signal(signum, prev)
        return prev(signum, frame)
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_handlers() -> None:
    global _HANDLERS_INSTALLED
    if _HANDLERS_INSTALLED or threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGINT):
        prev = signal.getsignal(sig)
        if prev in (signal.SIG_DFL, signal.default_int_handler, None):
            _PREVIOUS[sig] = prev
            signal.signal(sig, _on_signal)
    atexit.register(lambda: [t.close(reason="exit") for t in list(_LIVE)])
    _HANDLERS_INSTALLED = True


# The record fields `done` accounts from (a `done(**extra)` that overrides one of them takes the
# record's value, as the record says)
_FACTS = frozenset({"op", "group", "seq", "axis", "step", "payload_bytes", "bytes_sent",
                    "bytes_recv", "backend_bytes_sent"})


class _CommKind:
    """What every op of one (op, group, axis, payload, group size, root, backend op) shares,
    computed once per tracer: bytes from commbytes, the backend op, the totals key."""

    __slots__ = ("op", "group", "axis", "group_size", "payload", "sent", "recv", "bsent",
                 "tail", "total_key")

    def __init__(self, tracer: Tracer, op: str, gkey: str, axis: str, payload: int,
                 group_size: int, is_root, backend_op: str | None,
                 backend_payload_bytes: int | None):
        self.op, self.group, self.axis, self.group_size, self.payload = (op, gkey, axis,
                                                                         group_size, payload)
        self.sent, self.recv = _bytes(op, payload, group_size, bool(is_root))
        tail = {}  # the record's optional fields after `peer`, in the record's order
        if is_root or op in commbytes.ROOTED_OPS:
            tail["is_root"] = is_root
        if backend_op is None and tracer.backend:
            backend_op = BACKEND_OPS.get(tracer.backend, {}).get(op)
        self.bsent = self.sent
        if backend_op is not None and backend_op != op:
            bp = int(payload if backend_payload_bytes is None else backend_payload_bytes)
            tail["backend_op"], tail["backend_payload_bytes"] = backend_op, bp
            tail["backend_bytes_sent"] = self.bsent = _bytes(backend_op, bp, group_size,
                                                             bool(is_root))[0]
        self.tail = tail
        self.total_key = gkey + "/" + op


class _CommHandle:
    """An issued, possibly asynchronous communication; `done()` records its completion. The
    trace record (`rec`) is built when it is written (a traced step) or read, from the facts
    kept here: an untraced step's collectives only count."""

    __slots__ = ("tracer", "kind", "seq", "step", "microbatch", "peer", "args", "t0", "ev0",
                 "closed", "entry", "keep", "_rec", "_extra", "t1")

    def __init__(self, tracer: Tracer, kind: _CommKind, seq: int, peer, args: dict, t0: int,
                 ev0, entry, keep: bool):
        self.tracer, self.kind, self.seq, self.peer, self.args = tracer, kind, seq, peer, args
        self.step, self.microbatch = tracer.step, tracer.microbatch
        self.t0, self.ev0, self.entry, self.keep = t0, ev0, entry, keep
        self.closed, self._rec, self._extra, self.t1 = False, None, None, None

    @property
    def rec(self) -> dict:
        """The trace record (type comm; docs/trace-schema.md)."""
        rec = self._rec
        if rec is None:
            c = self.kind
            rec = {"type": "comm", "op": c.op, "axis": c.axis, "group": c.group,
                   "seq": self.seq, "group_size": c.group_size, "payload_bytes": c.payload,
                   "bytes_sent": c.sent, "bytes_recv": c.recv, "step": self.step,
                   "microbatch": self.microbatch, **self.args}
            if self.peer is not None:
                rec["peer"] = self.peer
            if c.tail:
                rec.update(c.tail)
            if self._extra:
                rec.update(self._extra)
            if self.t1 is not None:  # completed on an untraced step: timed, not written
                rec["ts_ns"], rec["dur_ns"] = self.t0, self.t1 - self.t0
            self._rec = rec
        return rec

    def done(self, **extra) -> None:
        if self.closed:
            return
        self.closed = True
        tr, c = self.tracer, self.kind
        if extra:
            if self._rec is None and not self.keep:
                self._extra = extra  # into the record only if it is ever read
            else:
                self.rec.update(extra)
            if not _FACTS.isdisjoint(extra):
                return self._done_from_record()
        t1 = self._account(c.group, self.seq, c.total_key, c.axis, c.op, self.step, c.payload,
                           c.sent, c.recv, c.bsent)
        if self.keep:  # an untraced step's collective is counted, not written
            tr._finish(self.rec, self.t0, self.ev0, True, t1)
        else:
            self.t1 = t1

    def _done_from_record(self) -> None:
        """`done` after `extra` changed one of the facts: account what the record says."""
        rec = self.rec
        g, op = rec["group"], rec["op"]
        t1 = self._account(g, rec["seq"], g + "/" + op, rec["axis"], op, rec["step"],
                           rec["payload_bytes"], rec["bytes_sent"], rec["bytes_recv"],
                           rec.get("backend_bytes_sent", rec["bytes_sent"]))
        self.tracer._finish(rec, self.t0, self.ev0, self.keep, t1)

    def _account(self, g: str, seq: int, key: str, axis: str, op: str, step: int, payload: int,
                 sent: float, recv: float, bsent: float) -> int:
        """The completion's bookkeeping (last completed seq, the flight ring, the totals per
        group/op and per axis/step); returns the completion time."""
        tr = self.tracer
        if seq > tr._done.get(g, -1):
            tr._done[g] = seq
        t1 = tr.now()
        tr.last_progress_ns = tr.flight.done(self.kind.group, self.entry, t1)
        tot = tr.comm_totals.get(key)
        if tot is None:
            tot = tr.comm_totals[key] = _total(g, axis, op)
        tot["count"] += 1
        tot["payload_bytes"] += payload
        tot["bytes_sent"] += sent
        tot["bytes_recv"] += recv
        tot["backend_bytes_sent"] += bsent
        by_axis = tr.comm_by_step.get(axis)
        if by_axis is None:
            by_axis = tr.comm_by_step[axis] = {}
        per = by_axis.get(step)
        if per is None:
            per = by_axis[step] = [0.0, 0.0]
        per[0] += sent
        per[1] += recv
        return t1

    def __enter__(self) -> dict:  # `Tracer.comm`: the span of the `with` body
        return self.rec

    def __exit__(self, *exc) -> bool:
        self.done()
        return False


def _total(group: str, axis: str, op: str) -> dict:
    return {"group": group, "axis": axis, "op": op, "count": 0, "payload_bytes": 0,
            "bytes_sent": 0.0, "bytes_recv": 0.0, "backend_bytes_sent": 0.0}


class _Span:
    """`Tracer.span`'s context manager (a class: a generator-based one costs more per span)."""

    __slots__ = ("tracer", "rec", "keep", "device", "t0", "ev0")

    def __init__(self, tracer: Tracer, rec: dict, keep: bool, device: bool):
        self.tracer, self.rec, self.keep, self.device = tracer, rec, keep, device

    def __enter__(self) -> dict:
        tr = self.tracer
        self.ev0 = tr._event() if (self.keep and tr.cuda and self.device) else None
        self.t0 = tr.now()
        return self.rec

    def __exit__(self, *exc) -> bool:
        self.tracer._finish(self.rec, self.t0, self.ev0, self.keep)
        return False


class Tracer:
    """Per-rank trace writer. See the module docstring and docs/trace-schema.md."""

    def __init__(self, out_dir: Path, rank: int, world_size: int, *, coords: dict | None = None,
                 meta: dict | None = None, flush_interval_s: float = 0.25,
                 sync_clock: bool = True, cuda_events: bool | None = None):
        self.rank, self.world_size = rank, world_size
        self.coords = dict(coords or {})
        self.step: int = -1
        self.microbatch: int | None = None
        self.path = Path(out_dir) / f"trace-rank{rank}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "w")  # noqa: SIM115 - closed in close()
        # the lines' columnar twin (jobs/trace_blocks.py): what the worker converts from
        self._blocks = open(trace_blocks.blocks_path(self.path), "wb")  # noqa: SIM115
        self._jsize = 0  # bytes of JSON lines written (ASCII: the encoder escapes the rest)
        self._block: list[dict] = []  # flushed records not yet in a block
        self._block_j0 = 0
        self._block_t = 0.0  # monotonic time of the last records added to self._block
        self._buf: list[dict] = []
        self._lock = threading.Lock()
        self._done: dict[str, int] = {}
        self.comm_totals: dict[str, dict] = {}  # "group/op" -> counts and bytes, this rank
        self.comm_by_step: dict[str, dict] = {}  # axis -> step -> [bytes sent, bytes received]
        self._kinds: dict[tuple, _CommKind] = {}  # comm_start's arguments -> their constants
        self._closed = False
        self._pending_cuda: list[tuple] = []
        self.backend = meta.get("backend") if meta else None
        self.stats = {"records": 0}
        self.fault = None  # jobs.faults.Injector on a rank with injected faults
        self.group_ranks: dict[str, list[int]] = {}  # group key -> global ranks (if known)
        self.flight = FlightRecorder(Path(out_dir) / f"flight-rank{rank}.json",
                                     backend=self.backend or "gloo", timeout_ms=_pg_timeout_ms())
        self.steps_completed = 0
        # bounded tracing (jobs/trace_schedule.py): the default traces every step in full
        self.trace_spec = None
        self.enabled, self.level, self.max_records = True, "layer", 0
        self.detail_records, self.capped = 0, False
        self._offset = time.time_ns() - time.perf_counter_ns()
        self.clock_error_ns = 0
        if sync_clock:
            self._sync_clock()
        import torch
        self._torch = torch
        self.cuda = torch.cuda.is_available() if cuda_events is None else cuda_events
        self._ref_ev, self._ref_ns = None, 0
        if self.cuda:
            self._ref_ev = torch.cuda.Event(enable_timing=True)
            self._ref_ev.record()
            self._ref_ev.synchronize()
            self._ref_ns = self.now()
        self.last_progress_ns = self.now()
        self._emit({"type": "meta", "schema": SCHEMA_VERSION, "world_size": world_size,
                    "coords": self.coords, "pid": os.getpid(), "t0_ns": self.now(),
                    "clock": "cuda_event" if self.cuda else "host",
                    "clock_offset_ns": self._offset, "clock_error_ns": self.clock_error_ns,
                    **(meta or {})})
        _LIVE.add(self)
        _install_handlers()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._flusher, args=(flush_interval_s,),
                                        name=f"tracer-flush-{rank}", daemon=True)
        self._thread.start()

    # --- clock ---------------------------------------------------------------------------------
    def now(self) -> int:
        """ns on the aligned clock."""
        return time.perf_counter_ns() + self._offset

    def _sync_clock(self, rounds: int = 8) -> None:
        """Shift this rank's clock onto rank 0's: best-of-`rounds` ping-pong with rank 0."""
        try:
            import torch
            import torch.distributed as dist
        except ImportError:  # pragma: no cover
            return
        if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() < 2:
            return
        if dist.get_world_size() != self.world_size:
            return
        me = dist.get_rank()
        dev = torch.device("cpu")
        if dist.get_backend() == "nccl":
            dev = torch.device("cuda", torch.cuda.current_device())
        buf = torch.zeros(1, dtype=torch.int64, device=dev)
        best = (None, 0)
        for peer in range(1, dist.get_world_size()):
            for _ in range(rounds):
                if me == 0:
                    dist.recv(buf, src=peer)
                    buf.fill_(self.now())
                    dist.send(buf, dst=peer)
                elif me == peer:
                    t0 = self.now()
                    dist.send(buf, dst=0)
                    dist.recv(buf, src=0)
                    t1 = self.now()
                    rtt = t1 - t0
                    if best[0] is None or rtt < best[0]:
                        best = (rtt, int(buf.item()) - (t0 + t1) // 2)
        if me != 0 and best[0] is not None:
            self._offset += best[1]
            self.clock_error_ns = best[0] // 2
        dist.barrier()

    # --- records -------------------------------------------------------------------------------
    def configure(self, trace_spec) -> None:
        """Take the spec's `trace` section (jobs.spec.TraceSpec)."""
        self.trace_spec = trace_spec
        self.level, self.max_records = trace_spec.level, max_records(trace_spec)
        self.flight.resize(trace_spec.flight_entries)

    def begin_step(self, step: int) -> bool:
        """Enter `step`; returns whether it is traced in detail (the schedule, then the cap:
        a step starts traced only while fewer than max_records detailed records were written,
        so a step is never cut in half)."""
        self.step = step
        on = is_scheduled(self.trace_spec, step)
        if on and self.max_records and self.detail_records >= self.max_records:
            if not self.capped:
                self.capped = True
                self.instant("trace_capped", max_records=self.max_records,
                             records=self.detail_records)
            on = False
        self.enabled = on
        return on

    def scalars(self, **fields) -> None:
        """The compact per-step record (every step, traced or not): loss, step time, tokens/s,
        peak memory figures; `traced` says whether the step has detailed records."""
        rec = {"type": "scalars", "ts_ns": self.now(), "traced": self.enabled,
               "rss_bytes": _rss_bytes(), **fields}
        if self.cuda:
            rec["cuda_peak_allocated_bytes"] = self._torch.cuda.max_memory_allocated()
        self._emit(rec)

    def _emit(self, rec: dict) -> None:
        if rec["type"] in DETAIL_TYPES:
            self.detail_records += 1
        rec.setdefault("rank", self.rank)
        rec.setdefault("step", self.step)
        rec.setdefault("microbatch", self.microbatch)
        self._buf.append(rec)  # list.append is atomic under the GIL

    def _event(self):
        ev = self._torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def _finish(self, rec: dict, t0: int, ev0, keep: bool = True, t1: int | None = None) -> None:
        if t1 is None:
            t1 = self.now()
        rec["ts_ns"], rec["dur_ns"] = t0, t1 - t0
        if rec.get("cat") == "step":  # a completed step: progress for the hang detector
            self.steps_completed += 1
            self.last_progress_ns = t1
            self.flight.dirty = True
        if not keep:  # an untraced step: timed (the loop reads dur_ns), not written
            return
        if ev0 is not None:
            self._pending_cuda.append((rec, ev0, self._event()))
            rec["host_ts_ns"], rec["host_dur_ns"] = t0, t1 - t0
        self._emit(rec)

    def span(self, name: str, cat: str = "compute", *, device: bool = True, **args) -> _Span:
        """A timed span (device-timed with CUDA events on GPU unless device=False)."""
        rec = {"type": "span", "name": name, "cat": cat, "step": self.step,
               "microbatch": self.microbatch, **args}
        keep = self.enabled and (self.level == "layer" or keeps_span(self.level, name, cat))
        return _Span(self, rec, keep, device)

    def comm_start(self, op: str, *, payload_bytes: int, group_size: int, axis: str = "dp",
                   group: str | None = None, peer: int | None = None, is_root: bool = False,
                   backend_op: str | None = None, backend_payload_bytes: int | None = None,
                   device: bool = True, **args) -> _CommHandle:
        """Record the issue of a (possibly async) op; call `.done()` on completion."""
        gkey = group or axis
        if self.fault is not None:  # injected faults (jobs/faults.py): delay, block, skip, alter
            act = self.fault.on_comm(op, gkey, axis, int(payload_bytes), group_size, args)
            if act == "skip":  # a skipped collective leaves no record, as a real bug would not
                return _NullHandle()
            if act:
                op, payload_bytes = act.get("op", op), act.get("payload_bytes", payload_bytes)
        payload_bytes = int(payload_bytes)
        ck = (op, gkey, axis, payload_bytes, group_size, is_root, backend_op,
              backend_payload_bytes)
        kind = self._kinds.get(ck)
        if kind is None:
            kind = self._kinds[ck] = _CommKind(self, *ck)
        seq = self.flight.next_seq(gkey)  # the flight recorder counts issues (enter below)
        keep = self.enabled and self.level not in NO_SAMPLES
        ev0 = self._event() if (keep and self.cuda and device) else None  # async: host timing
        t0 = self.now()
        entry = self.flight.enter_at(gkey, seq, op, payload_bytes, args.get("dtype"),
                                     group_size, self.step, t0, peer, frames_here())
        return _CommHandle(self, kind, seq, peer, args, t0, ev0, entry, keep)

    def comm(self, op: str, *, payload_bytes: int, group_size: int, axis: str = "dp",
             group: str | None = None, peer: int | None = None, is_root: bool = False,
             **args) -> _CommHandle:
        """A synchronous communication: the span of the `with` body."""
        return self.comm_start(op, payload_bytes=payload_bytes, group_size=group_size,
                               axis=axis, group=group, peer=peer, is_root=is_root, **args)

    def memory(self, **bytes_by_component) -> dict:
        """A memory sample: the given components (bytes) plus RSS / CUDA allocator figures."""
        if not self.enabled or self.level in NO_SAMPLES:
            return {}
        rec = {"type": "mem", "ts_ns": self.now(), "step": self.step,
               "microbatch": self.microbatch, "rss_bytes": _rss_bytes(),
               **bytes_by_component}
        if self.cuda:
            cuda = self._torch.cuda
            rec["cuda_allocated_bytes"] = cuda.memory_allocated()
            rec["cuda_peak_allocated_bytes"] = cuda.max_memory_allocated()
            rec["cuda_reserved_bytes"] = cuda.memory_reserved()
        self._emit(rec)
        return rec

    def instant(self, name: str, **args) -> None:
        self._emit({"type": "instant", "name": name, "ts_ns": self.now(), "step": self.step,
                    "microbatch": self.microbatch, **args})

    def record(self, type: str, **fields) -> None:
        """Any other record type (e.g. `summary`-like facts another module wants kept); the
        detailed ones (`moe`) only on traced steps."""
        if type in DETAIL_TYPES and (not self.enabled or self.level in NO_SAMPLES):
            return
        self._emit({"type": type, "ts_ns": self.now(), **fields})

    def flight_note(self, key: str, value) -> None:
        """A fact the diagnosis reads from the flight file (`exit`, `nonfinite`)."""
        self.flight.extra[key] = value
        self.flight.dirty = True

    def write_flight(self) -> None:
        self.flight.write(self)

    # --- output --------------------------------------------------------------------------------
    def _resolve_cuda(self) -> None:
        if not self._pending_cuda:
            return
        pending, self._pending_cuda = self._pending_cuda, []
        for rec, e0, e1 in pending:
            e1.synchronize()
            start = self._ref_ns + int(self._ref_ev.elapsed_time(e0) * 1e6)
            rec["ts_ns"], rec["dur_ns"] = start, int(e0.elapsed_time(e1) * 1e6)

    def flush(self) -> None:
        if self.cuda and threading.current_thread() is threading.main_thread():
            self._resolve_cuda()
        with self._lock:
            if self._f.closed:
                return
            n = len(self._buf)
            if not n:
                if self._block and time.monotonic() - self._block_t > trace_blocks.IDLE_S:
                    self._block_records([], self._jsize, idle=True)
                return
            # records with unresolved CUDA events wait for a main-thread flush
            pend = {id(r) for r, _, _ in self._pending_cuda}
            out, keep = [], []
            for r in self._buf[:n]:
                (keep if id(r) in pend else out).append(r)
            del self._buf[:n]
            self._buf[:0] = keep
            if out:
                enc = _ENCODER.encode
                yield_gil = threading.current_thread() is self._thread
                j0 = self._jsize
                for i in range(0, len(out), 32):
                    text = "".join([enc(r) + "\n" for r in out[i:i + 32]])
                    self._f.write(text)
                    self._jsize += len(text)
                    if yield_gil:  # let the training thread run between small chunks
                        time.sleep(0)
                self._f.flush()
                self.stats["records"] += len(out)
                self._block_records(out, j0)

    def _block_records(self, out: list[dict], j0: int, idle: bool = False) -> None:
        """Flushed records into the blocks file (jobs/trace_blocks.py), after their lines: a
        block per BLOCK_RECORDS records, one at close, and one when no record came for IDLE_S
        (a hung rank, killed later without its close, keeps its blocks whole). The lines are
        what a kill must not lose; the blocks only spare the converter parsing them (records
        lost before a block was written break the chain, and the converter reads the lines)."""
        if self._blocks is None:
            return
        if out:
            if not self._block:
                self._block_j0 = j0
            self._block.extend(out)
            self._block_t = time.monotonic()
        if not self._block or (len(self._block) < trace_blocks.BLOCK_RECORDS
                               and not self._closed and not idle):
            return
        recs, self._block = self._block, []
        try:
            self._blocks.write(trace_blocks.encode(recs, self._block_j0, self._jsize,
                                                   _ENCODER.encode))
            self._blocks.flush()
        except Exception:  # noqa: BLE001 - a broken chain (the converter reads the lines),
            self._blocks = None  # never a run taken down

    def _flusher(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                if self.flight.dirty:
                    self.flight.write(self, periodic=True)
                self.flush()
            except Exception:  # noqa: BLE001 - never take the run down from the flusher
                pass

    def close(self, reason: str = "ok") -> None:
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)
        self._emit({"type": "end", "ts_ns": self.now(), "reason": reason,
                    "issued": self.flight.issued(), "last_completed_seq": dict(self._done)})
        self.flight.extra["closed"] = {"reason": reason, "ts_ns": self.now()}
        try:
            self.flight.write(self)
        except OSError:  # pragma: no cover - the trace below still gets its end record
            pass
        try:
            self.flush()
        finally:
            with self._lock:
                self._f.close()
                if self._blocks is not None:
                    self._blocks.close()
        _LIVE.discard(self)

    def rewrite_flight(self) -> None:
        """The flight files once more, whole: for a signal handled inside close() (Python runs
        handlers on the main thread, between two of close()'s bytecodes), after which the
        process ends. close() had set `_closed`, so the handler's own close() did nothing and
        the dump close() was writing was never renamed into place (a rank SIGTERMed by
        torchrun while it closed after a collective's error left no flight dump)."""
        try:
            self.flight.write(self)
        except Exception:  # noqa: BLE001 - last words are best effort: the process is ending
            pass

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.close("ok" if exc is None else f"error: {exc_type.__name__}")


class NullTracer:
    """The Tracer surface doing nothing (strategies accept `tracer=None`)."""

    step = -1
    microbatch = None
    enabled = True
    backend = None
    clock_error_ns = 0
    fault = None

    def __init__(self):
        self.comm_totals: dict = {}
        self.comm_by_step: dict = {}

    @contextlib.contextmanager
    def span(self, name, cat="compute", **args):
        rec = {}  # the loop reads a step's duration from its span record
        t0 = time.perf_counter_ns()
        try:
            yield rec
        finally:
            rec["dur_ns"] = time.perf_counter_ns() - t0

    @contextlib.contextmanager
    def comm(self, op, **kw):
        yield {}

    def comm_start(self, op, **kw):
        return _NullHandle()

    def memory(self, **kw):
        return {}

    def instant(self, name, **args):
        pass

    def configure(self, trace_spec):
        pass

    def begin_step(self, step):
        self.step = step
        return True

    def scalars(self, **fields):
        pass

    def record(self, type, **fields):
        pass

    def flight_note(self, key, value):
        pass

    def write_flight(self):
        pass

    def now(self) -> int:
        return time.perf_counter_ns()

    def flush(self):
        pass

    def close(self, reason="ok"):
        pass


class _NullHandle:
    rec: dict = {}

    def done(self, **extra):
        pass

    def __enter__(self) -> dict:
        return {}

    def __exit__(self, *exc) -> bool:
        return False
