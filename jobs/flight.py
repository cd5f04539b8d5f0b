"""The flight recorder of one rank, in PyTorch's flight-recorder dump format (docs/faults.md).

One ring of the rank's last `entries` collectives over all its process groups (torch's
TORCH_FR_BUFFER_SIZE default: 2000; spec `trace.flight_entries`), each entry a dict with the
fields torch's FlightRecorder dumps (record_id, pg_id, process_group, collective_seq_id,
p2p_seq_id, op_id, profiling_name, time_created_ns, input/output sizes and dtypes, state,
time_discovered_started/completed_ns, retired, timeout_ms, is_p2p, frames) plus a `paralab`
dict (group, op, payload_bytes, dtype, group_size, step). The tracer (jobs/trace.py) feeds it
from `comm_start` / `done` (compact entries: torch's dicts are built when dumping); its flusher
thread writes, whenever it changed (torch's dump: see `write` for when it waits):

- `flight/flight_rank_{R}`: `dump()` pickled, what torch's analyzer reads unchanged
  (`python -m torch.distributed.flight_recorder.fr_trace OUT/flight`);
- `flight-rank{R}.json`: `view(dump)`, paralab's own view, derived from that same dump.

Both are written to a temporary name and renamed (never half a file), so a rank blocked inside
a collective still shows where it is. `op_id` is paralab's per-group `seq` (every op of the
group, 0-based); `collective_seq_id` counts the group's collectives, `p2p_seq_id` its
send/recv. Entries of a group whose member ranks are unknown, or of an op torch's analyzer
does not know, stay in the dump's `paralab.other_entries` (the analyzer would fail on them).
Standard library only.

View fields: {rank, pid, world_size, coords, step (the step the rank is in), steps_completed,
last_progress_ns (aligned clock: the last completed collective or step), updated_ns, closed
({reason, ts_ns} once the tracer closed), exit ({code, reason, step, ts_ns}: last words of a
hard exit), nonfinite ({step, what, value}: this rank saw a non-finite loss or parameters),
groups: {key: {ranks (global ranks, if known), issued, completed, open (entered, not
completed), in_flight (the oldest open entry or null), last_completed, ring (its last RING
entries)}}}. A view entry: {seq, op, payload_bytes, dtype, group_size, ts_ns, step, end_ns
(null: not completed)}.
"""

from __future__ import annotations

import json
import operator
import os
import pickle
import sys
import threading
import time
from collections import deque
from pathlib import Path

RING = 64  # entries per group in the JSON view
DEFAULT_ENTRIES = 2000  # torch's TORCH_FR_BUFFER_SIZE default
VERSION = "2.10"  # the dump format version torch 2.13's FlightRecorder writes
DUMP_DIR = "flight"  # OUT/flight/flight_rank_{R}: nothing else in it (fr_trace's prefix)
FRAMES = 16  # stack frames kept per entry, innermost first
# paralab op -> torch's name (flight_recorder/components/types.py: COLLECTIVES | P2P)
TORCH_OPS = {"all_reduce": "all_reduce", "broadcast": "broadcast", "reduce": "reduce",
             "all_gather": "all_gather", "reduce_scatter": "reduce_scatter",
             "all_to_all": "all_to_all", "barrier": "barrier", "gather": "gather",
             "scatter": "scatter", "send": "send", "isend": "send", "recv": "recv",
             "irecv": "recv"}
P2P = ("send", "recv")
_NAMES = frozenset(TORCH_OPS.values())
STACKS = 4096  # distinct stacks interned per rank (their frame dicts shared by entries)
# element type name -> (c10 name in torch's dumps, bytes)
DTYPES = {"float32": ("Float", 4), "float64": ("Double", 8), "bfloat16": ("BFloat16", 2),
          "float16": ("Half", 2), "int64": ("Long", 8), "int32": ("Int", 4),
          "int8": ("Char", 1), "uint8": ("Byte", 1), "bool": ("Bool", 1)}
_SKIP = (os.path.join("jobs", "trace.py"), os.path.join("jobs", "flight.py"), "contextlib.py")
_CODE, _LASTI = operator.attrgetter("f_code"), operator.attrgetter("f_lasti")
# While the ring keeps moving, the flusher's torch dump waits DUMP_EVERY_S and its JSON view
# VIEW_EVERY_S. A dump builds torch's dict of every entry it holds (~13 us each, once) and pickles
# the ring; the view costs ~0.5 ms: written four times a second they were most of the tracer's
# cost at `level: off`. A rank that stops moving (blocked, idle) has both on disk within two
# turns, and the hang detector (worker/hang.py, timeouts of seconds) reads a view at most
# VIEW_EVERY_S behind a moving rank. torch's own recorder dumps only on a failure or a request;
# the periodic dump is for a rank killed while moving (SIGKILL runs no handler).
DUMP_EVERY_S = 60.0
VIEW_EVERY_S = 1.0


def dump_path(out_dir, rank: int) -> Path:
    return Path(out_dir) / DUMP_DIR / f"flight_rank_{rank}"


def frames_here() -> tuple:
    """The issuing call's stack, innermost first, without the tracer's own frames: the code
    objects and instruction offsets of FRAMES frames. Names and lines are looked up
    when the entry is first dumped (`FlightRecorder._symbolize`): the training thread pays for
    no line table and no string per collective. (torch's own capture, gather_traceback, is
    cheaper per call but its first symbolization costs seconds of CPU.)"""
    f = sys._getframe(1)
    while f is not None and f.f_code.co_filename.endswith(_SKIP):
        f = f.f_back
    fs = []
    for _ in range(FRAMES):
        if f is None:
            break
        fs.append(f)
        f = f.f_back
    return tuple(map(_CODE, fs)), tuple(map(_LASTI, fs))


def _line(code, lasti: int) -> int | None:
    """The line of the instruction at byte offset `lasti` (what frame.f_lineno says)."""
    for start, stop, line in code.co_lines():
        if start <= lasti < stop:
            return line
    return None


def sizes(op: str, payload_bytes: int, dtype, n: int) -> tuple[list, list, str]:
    """(input_sizes, output_sizes, c10 dtype) of one flat tensor carrying the op's logical
    payload S (jobs/commbytes.py: all-gather's S is its output, reduce-scatter's its input).
    An unknown dtype counts bytes (Byte)."""
    name, es = DTYPES.get(dtype or "", ("Byte", 1))
    numel, n = int(payload_bytes) // es, max(1, int(n or 1))
    if op == "all_gather":
        return [[numel // n]], [[numel]], name
    if op == "reduce_scatter":
        return [[numel]], [[numel // n]], name
    return [[numel]], [[numel]], name


class _Group:
    """One process group's counters, its open entries and the entries its view needs."""

    __slots__ = ("pg_id", "issued", "completed", "coll", "p2p", "open", "recent", "last")

    def __init__(self, pg_id: int):
        self.pg_id = pg_id
        self.issued = self.completed = self.coll = self.p2p = 0
        self.open: dict[int, _Entry] = {}  # record_id -> entered, not completed
        self.recent: deque = deque(maxlen=RING)  # its last RING entries (the ring may hold fewer)
        self.last: _Entry | None = None  # the completed entry of latest (end, record_id)


class _Entry:
    """One issued op as the hot path records it: the raw facts. Torch's dict (`_torch`) is
    built when a dump needs it, and kept once the entry is completed (it no longer changes)."""

    __slots__ = ("rid", "key", "pg_id", "coll", "p2p_id", "seq", "op", "kind", "is_p2p",
                 "payload_bytes", "dtype", "group_size", "step", "t_ns", "peer", "frames",
                 "thread", "end_ns", "d")


class FlightRecorder:
    def __init__(self, path: Path, *, entries: int = DEFAULT_ENTRIES, backend: str = "gloo",
                 timeout_ms: int = 0):
        self.path = Path(path)  # flight-rank{R}.json; the dump goes to OUT/flight/
        self.groups: dict[str, _Group] = {}
        self.ring: deque = deque(maxlen=entries)
        self.record_id = 0
        self._stacks: dict[tuple, list] = {}  # (name, filename, line)s -> torch's frame dicts
        self._by_ids: dict[tuple, tuple] = {}  # frames_here() by ids -> (codes, frame dicts)
        self._ops: dict[str, tuple] = {}  # op -> (torch's name, is_p2p, profiling_name)
        self.backend, self.timeout_ms = backend or "gloo", int(timeout_ms)
        self.extra: dict = {"closed": None, "exit": None, "nonfinite": None}
        self.dirty = True
        self.changes = 0  # entries entered or completed so far (the flusher's quiet test)
        # the flusher's last turn, its next dump and view (monotonic seconds)
        self._seen, self._next_dump, self._next_view = -1, 0.0, 0.0

    def resize(self, entries: int) -> None:
        """Keep the last `entries` (spec trace.flight_entries)."""
        if entries != self.ring.maxlen:
            self.ring = deque(list(self.ring), maxlen=entries)
            self.dirty = True
            self.changes += 1

    def next_seq(self, key: str) -> int:
        """The sequence number the next collective of group `key` gets (issued so far)."""
        g = self.groups.get(key)
        return 0 if g is None else g.issued

    def issued(self) -> dict[str, int]:
        return {k: g.issued for k, g in self.groups.items()}

    def enter(self, key: str, seq: int, op: str, *, payload_bytes: int, dtype, group_size: int,
              step: int, t_ns: int, peer: int | None = None, frames: tuple = ()) -> _Entry:
        """Record an issued op (started at t_ns; `frames` as frames_here() returns them);
        returns the entry `done` takes."""
        return self.enter_at(key, seq, op, payload_bytes, dtype, group_size, step, t_ns, peer,
                             frames)

    def enter_at(self, key: str, seq: int, op: str, payload_bytes: int, dtype, group_size: int,
                 step: int, t_ns: int, peer: int | None, frames) -> _Entry:
        """`enter` with positional arguments (the tracer's hot path: keywords cost more)."""
        g = self.groups.get(key)
        if g is None:
            g = self.groups[key] = _Group(len(self.groups))
        kind = self._ops.get(op)
        if kind is None:
            top = TORCH_OPS.get(op, op)
            kind = self._ops[op] = (top, top in P2P, f"{self.backend}:{top}")
        th = threading.current_thread()
        e = _Entry()
        e.rid, e.key, e.pg_id, e.coll, e.p2p_id, e.seq = (self.record_id, key, g.pg_id, g.coll,
                                                          g.p2p, seq)
        e.op, e.kind, e.is_p2p, e.payload_bytes, e.dtype, e.group_size = (
            op, kind, kind[1], int(payload_bytes), dtype, group_size)
        e.step, e.t_ns, e.peer, e.frames, e.thread = step, t_ns, peer, frames, (th.name,
                                                                               th.ident)
        e.end_ns = e.d = None
        self.record_id += 1
        if kind[1]:
            g.p2p += 1
        else:
            g.coll += 1
        g.issued = seq + 1
        g.open[e.rid] = e
        g.recent.append(e)
        self.ring.append(e)
        self.dirty = True
        self.changes += 1
        return e

    def done(self, key: str, entry: _Entry, t_ns: int) -> int:
        """Mark `entry` completed at t_ns; returns t_ns (the tracer's new progress time)."""
        entry.end_ns = t_ns
        g = self.groups[key]
        g.completed += 1
        g.open.pop(entry.rid, None)
        last = g.last
        if last is None or t_ns > last.end_ns or (t_ns == last.end_ns and entry.rid > last.rid):
            g.last = entry
        self.dirty = True
        self.changes += 1
        return t_ns

    # --- torch's dicts, built when dumping -------------------------------------------------------
    def _symbolize(self, entries: list) -> None:
        """Replace the frames_here() stacks of `entries` by torch's frame dicts (name,
        filename, line), shared by the entries of one stack."""
        by_ids = self._by_ids
        for e in entries:
            frames = e.frames
            if isinstance(frames, list):  # done (by the other thread, maybe)
                continue
            codes, lastis = frames if frames else ((), ())
            ids = (tuple(map(id, codes)), lastis)
            hit = by_ids.get(ids)
            if hit is not None and hit[0] == codes:  # kept codes keep their ids: same stack
                e.frames = hit[1]
                continue
            key = tuple((c.co_name, c.co_filename, _line(c, i)) for c, i in zip(codes, lastis,
                                                                                 strict=True))
            fl = self._stacks.get(key)
            if fl is None:
                fl = [{"name": n, "filename": f, "line": ln} for n, f, ln in key]
                if len(self._stacks) < STACKS:
                    self._stacks[key] = fl
            if len(by_ids) < STACKS:
                by_ids[ids] = (codes, fl)
            e.frames = fl

    def _torch(self, e: _Entry) -> dict:
        """The entry in torch's format (kept once completed: a completed entry is final)."""
        d = e.d
        if d is not None:
            return d
        self._symbolize([e])
        ins, outs, dt = sizes(e.op, e.payload_bytes, e.dtype, e.group_size)
        end = e.end_ns
        d = {"record_id": e.rid, "pg_id": e.pg_id, "process_group": (e.key, e.key),
             "thread_name": e.thread[0], "thread_id": str(e.thread[1]),
             "collective_seq_id": e.coll, "p2p_seq_id": e.p2p_id, "op_id": e.seq,
             "profiling_name": e.kind[2], "time_created_ns": e.t_ns,
             "input_sizes": ins, "input_dtypes": [dt], "output_sizes": outs,
             "output_dtypes": [dt], "state": "started" if end is None else "completed",
             "time_discovered_started_ns": e.t_ns, "time_discovered_completed_ns": end,
             "retired": end is not None, "timeout_ms": self.timeout_ms, "is_p2p": e.is_p2p,
             "frames": e.frames,
             "paralab": {"group": e.key, "op": e.op, "payload_bytes": e.payload_bytes,
                         "dtype": e.dtype, "group_size": e.group_size, "step": e.step,
                         "peer": e.peer}}
        if end is not None:
            e.d = d
        return d

    def _state(self, tr) -> dict:
        """The rank's state: the dump's `paralab` keys but its entries and groups."""
        return {"rank": tr.rank, "pid": os.getpid(), "world_size": tr.world_size,
                "coords": tr.coords, "step": tr.step, "steps_completed": tr.steps_completed,
                "last_progress_ns": tr.last_progress_ns, "updated_ns": tr.now(), **self.extra}

    def dump(self, tr) -> dict:
        """The rank's dump: torch's keys (version, pg_config, pg_status, entries) and
        `paralab` (the rank's state and what torch's analyzer cannot read)."""
        ring = list(self.ring)
        known = {k: list(v) for k, v in tr.group_ranks.items() if v}
        ours = list(self.groups.items())
        size = {e.key: e.group_size for e in ring}  # the last entry's, per group
        for k, g in ours:
            if k not in known and g.issued and size.get(k) == tr.world_size:
                known[k] = list(range(tr.world_size))  # the whole world: its ranks are known
        self._symbolize([e for e in ring if e.d is None])
        entries, other, done = [], [], {}
        for e in ring:
            d = self._torch(e)  # shared with the next dump: frames and `paralab` never change
            readable = e.key in known and e.kind[0] in _NAMES
            if readable and e.is_p2p:
                d = dict(d)
                readable = self._p2p_name(d, known[e.key], tr.rank)
            (entries if readable else other).append(d)
            if e.end_ns is not None and not e.is_p2p and e.coll > done.get(e.key, -1):
                done[e.key] = e.coll
        pg_config = {k: {"name": k, "desc": k, "ranks": str(r)} for k, r in known.items()}
        status = {k: {"last_enqueued_collective": g.coll - 1,
                      "last_started_collective": g.coll - 1,
                      "last_completed_collective": done.get(k, -1)} for k, g in ours}
        return {"version": VERSION, "comm_lib_version": "", "pg_config": pg_config,
                "pg_status": status, "entries": entries,
                "paralab": {**self._state(tr), "ring_entries": self.ring.maxlen,
                            "groups": {k: {"ranks": tr.group_ranks.get(k), "issued": g.issued,
                                           "completed": g.completed} for k, g in ours},
                            "other_entries": other}}

    def view(self, tr) -> dict:
        """view(self.dump(tr)), from the entries and the groups' own bookkeeping: what the
        flusher writes every turn, without building torch's dicts of the whole ring."""
        ring = self.ring
        oldest = ring[0].rid if ring else self.record_id  # older entries left the ring
        groups = {}
        for key, g in list(self.groups.items()):
            if len(g.open) > 2 * (ring.maxlen or 1):  # never completed and long gone: drop
                g.open = {r: e for r, e in list(g.open.items()) if r >= oldest}
            open_ = [e for e in list(g.open.values()) if e.rid >= oldest]
            last = g.last
            if last is not None and last.rid < oldest:  # left the ring: the latest still in it
                last = max((e for e in list(ring) if e.key == key and e.end_ns is not None),
                           key=lambda e: (e.end_ns, e.rid), default=None)
            groups[key] = {"ranks": tr.group_ranks.get(key), "issued": g.issued,
                           "completed": g.completed, "open": g.issued - g.completed,
                           "in_flight": _ventry(min(open_, key=lambda e: e.seq))
                           if open_ else None,
                           "last_completed": _ventry(last) if last else None,
                           "ring": [_ventry(e) for e in list(g.recent) if e.rid >= oldest]}
        return {**self._state(tr), "groups": groups}

    @staticmethod
    def _p2p_name(e: dict, ranks: list, rank: int) -> bool:
        """Name a send/recv torch's way (`gloo:send 0->1`, group-local ranks); False when the
        peer is unknown."""
        peer = e["paralab"]["peer"]
        if peer is None or rank not in ranks or not 0 <= peer < len(ranks):
            return False
        me, (lib, op) = ranks.index(rank), e["profiling_name"].split(":")
        e["profiling_name"] = (f"{lib}:send {me}->{peer}" if op == "send"
                               else f"{lib}:recv {me}<-{peer}")
        return True

    def write(self, tr, *, periodic: bool = False) -> None:
        """Both files, each written to a temporary name and renamed. `periodic` (the flusher's
        turn): while the ring moves, the JSON view waits VIEW_EVERY_S after the last one and
        torch's dump DUMP_EVERY_S; a turn that finds the ring as the previous turn left it (the
        rank is blocked or idle) writes both, so what a hang leaves is on disk within two turns.
        Every other write (close, a fault's last words, a signal) has both."""
        changes, now = self.changes, time.monotonic()
        quiet, self._seen = changes == self._seen, changes
        due = not periodic or quiet or now >= self._next_dump
        if not due and now < self._next_view:
            return  # still dirty: the next turn looks again
        self.dirty = False
        for _ in range(3):  # the main thread may change the ring while it is read: retry
            try:
                d = self.dump(tr) if due else None
                text = json.dumps(view(d) if due else self.view(tr), default=str)
                blob = pickle.dumps(d, protocol=pickle.HIGHEST_PROTOCOL) if due else None
                break
            except RuntimeError:
                continue
        else:  # pragma: no cover
            self.dirty = True
            return
        self._next_view = now + VIEW_EVERY_S
        if due:
            self._next_dump = now + DUMP_EVERY_S
        else:
            self.dirty = True  # the dump is behind: the next turn looks again
        # one temporary per thread: the flusher and the main thread (a fault's last words, a
        # signal handler's close) may write at once; each rename is whole, the last one wins.
        # The dump's temporary lies beside OUT/flight, never in it (fr_trace reads every file)
        tid = threading.get_ident()
        dst = dump_path(self.path.parent, tr.rank)
        out = [(text, self.path, "w")]
        if due:
            dst.parent.mkdir(exist_ok=True)
            out.insert(0, (blob, dst, "wb"))
        for data, final, mode in out:
            tmp = self.path.with_name(f"{final.name}.{tid}.tmp")
            with open(tmp, mode) as f:
                f.write(data)
            os.replace(tmp, final)


def _ventry(e: _Entry) -> dict:
    """A view entry (as `_entry` makes it from torch's dict)."""
    return {"seq": e.seq, "op": e.op, "payload_bytes": e.payload_bytes, "dtype": e.dtype,
            "group_size": e.group_size, "ts_ns": e.t_ns, "step": e.step, "end_ns": e.end_ns}


def _entry(e: dict) -> dict:
    p = e["paralab"]
    return {"seq": e["op_id"], "op": p["op"], "payload_bytes": p["payload_bytes"],
            "dtype": p["dtype"], "group_size": p["group_size"], "ts_ns": e["time_created_ns"],
            "step": p["step"], "end_ns": e["time_discovered_completed_ns"]}


def view(dump: dict) -> dict:
    """paralab's flight-rank{R}.json from a dump (the module docstring lists its fields)."""
    p = dump["paralab"]
    ents = sorted(dump["entries"] + p["other_entries"], key=lambda e: e["record_id"])
    groups = {}
    for key, g in p["groups"].items():
        mine = [e for e in ents if e["paralab"]["group"] == key]
        open_ = [e for e in mine if e["state"] != "completed"]
        done = [e for e in mine if e["state"] == "completed"]
        last = max(done, key=lambda e: (e["time_discovered_completed_ns"], e["record_id"]),
                   default=None)
        groups[key] = {"ranks": g["ranks"], "issued": g["issued"], "completed": g["completed"],
                       "open": g["issued"] - g["completed"],
                       "in_flight": _entry(min(open_, key=lambda e: e["op_id"]))
                       if open_ else None,
                       "last_completed": _entry(last) if last else None,
                       "ring": [_entry(e) for e in mine[-RING:]]}
    skip = ("groups", "other_entries", "ring_entries")
    return {**{k: v for k, v in p.items() if k not in skip}, "groups": groups}
