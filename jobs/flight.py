"""The flight recorder of one rank, in PyTorch's flight-recorder dump format (docs/faults.md).

One ring of the rank's last `entries` collectives over all its process groups (torch's
TORCH_FR_BUFFER_SIZE default: 2000; spec `trace.flight_entries`), each entry a dict with the
fields torch's FlightRecorder dumps (record_id, pg_id, process_group, collective_seq_id,
p2p_seq_id, op_id, profiling_name, time_created_ns, input/output sizes and dtypes, state,
time_discovered_started/completed_ns, retired, timeout_ms, is_p2p, frames) plus a `paralab`
dict (group, op, payload_bytes, dtype, group_size, step). The tracer (jobs/trace.py) feeds it
from `comm_start` / `done`; its flusher thread writes, whenever it changed:

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
import os
import pickle
import sys
import threading
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


def dump_path(out_dir, rank: int) -> Path:
    return Path(out_dir) / DUMP_DIR / f"flight_rank_{rank}"


def frames_here() -> tuple:
    """The issuing call's stack, innermost first, without the tracer's own frames: FRAMES
    (name, filename, line) from the frame objects (no source lookup: a few microseconds)."""
    f, out = sys._getframe(1), []
    while f is not None and len(out) < FRAMES:
        code = f.f_code
        if out or not code.co_filename.endswith(_SKIP):
            out.append((code.co_name, code.co_filename, f.f_lineno))
        f = f.f_back
    return tuple(out)


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
    __slots__ = ("pg_id", "issued", "completed", "coll", "p2p")

    def __init__(self, pg_id: int):
        self.pg_id = pg_id
        self.issued = self.completed = self.coll = self.p2p = 0


class FlightRecorder:
    def __init__(self, path: Path, *, entries: int = DEFAULT_ENTRIES, backend: str = "gloo",
                 timeout_ms: int = 0):
        self.path = Path(path)  # flight-rank{R}.json; the dump goes to OUT/flight/
        self.groups: dict[str, _Group] = {}
        self.ring: deque = deque(maxlen=entries)
        self.record_id = 0
        self._stacks: dict[tuple, list] = {}  # (name, filename, line)s -> torch's frame dicts
        self.backend, self.timeout_ms = backend or "gloo", int(timeout_ms)
        self.extra: dict = {"closed": None, "exit": None, "nonfinite": None}
        self.dirty = True

    def resize(self, entries: int) -> None:
        """Keep the last `entries` (spec trace.flight_entries)."""
        if entries != self.ring.maxlen:
            self.ring = deque(list(self.ring), maxlen=entries)
            self.dirty = True

    def next_seq(self, key: str) -> int:
        """The sequence number the next collective of group `key` gets (issued so far)."""
        g = self.groups.get(key)
        return 0 if g is None else g.issued

    def issued(self) -> dict[str, int]:
        return {k: g.issued for k, g in self.groups.items()}

    def enter(self, key: str, seq: int, op: str, *, payload_bytes: int, dtype, group_size: int,
              step: int, t_ns: int, peer: int | None = None, frames: tuple = ()) -> dict:
        """Record an issued op (started at t_ns); returns the entry `done` takes."""
        g = self.groups.get(key)
        if g is None:
            g = self.groups[key] = _Group(len(self.groups))
        top = TORCH_OPS.get(op, op)
        p2p = top in P2P
        ins, outs, dt = sizes(op, payload_bytes, dtype, group_size)
        fl = self._stacks.get(frames)
        if fl is None:
            fl = [{"name": n, "filename": f, "line": ln} for n, f, ln in frames]
            if len(self._stacks) < STACKS:
                self._stacks[frames] = fl
        entry = {"record_id": self.record_id, "pg_id": g.pg_id, "process_group": (key, key),
                 "thread_name": threading.current_thread().name,
                 "thread_id": str(threading.get_ident()),
                 "collective_seq_id": g.coll, "p2p_seq_id": g.p2p, "op_id": seq,
                 "profiling_name": f"{self.backend}:{top}", "time_created_ns": t_ns,
                 "input_sizes": ins, "input_dtypes": [dt], "output_sizes": outs,
                 "output_dtypes": [dt], "state": "started", "time_discovered_started_ns": t_ns,
                 "time_discovered_completed_ns": None, "retired": False,
                 "timeout_ms": self.timeout_ms, "is_p2p": p2p, "frames": fl,
                 "paralab": {"group": key, "op": op, "payload_bytes": int(payload_bytes),
                             "dtype": dtype, "group_size": group_size, "step": step,
                             "peer": peer}}
        self.record_id += 1
        if p2p:
            g.p2p += 1
        else:
            g.coll += 1
        g.issued = seq + 1
        self.ring.append(entry)
        self.dirty = True
        return entry

    def done(self, key: str, entry: dict, t_ns: int) -> int:
        """Mark `entry` completed at t_ns; returns t_ns (the tracer's new progress time)."""
        entry["time_discovered_completed_ns"] = t_ns
        entry["state"], entry["retired"] = "completed", True
        self.groups[key].completed += 1
        self.dirty = True
        return t_ns

    def dump(self, tr) -> dict:
        """The rank's dump: torch's keys (version, pg_config, pg_status, entries) and
        `paralab` (the rank's state and what torch's analyzer cannot read)."""
        known = {k: list(v) for k, v in tr.group_ranks.items() if v}
        ours = list(self.groups.items())
        for k, g in ours:
            if k not in known and g.issued and self._size(k) == tr.world_size:
                known[k] = list(range(tr.world_size))  # the whole world: its ranks are known
        entries, other = [], []
        for e in list(self.ring):
            e = dict(e)  # frames and `paralab` are never changed: shared
            p = e["paralab"]
            readable = p["group"] in known and e["profiling_name"].split(":")[1] in _NAMES
            if readable and e["is_p2p"]:
                readable = self._p2p_name(e, known[p["group"]], tr.rank)
            (entries if readable else other).append(e)
        pg_config = {k: {"name": k, "desc": k, "ranks": str(r)} for k, r in known.items()}
        status = {}
        for k, g in ours:
            status[k] = {"last_enqueued_collective": g.coll - 1,
                         "last_started_collective": g.coll - 1,
                         "last_completed_collective": max(
                             (e["collective_seq_id"] for e in entries + other
                              if e["paralab"]["group"] == k and e["state"] == "completed"
                              and not e["is_p2p"]), default=-1)}
        return {"version": VERSION, "comm_lib_version": "", "pg_config": pg_config,
                "pg_status": status, "entries": entries,
                "paralab": {"rank": tr.rank, "pid": os.getpid(), "world_size": tr.world_size,
                            "coords": tr.coords, "step": tr.step,
                            "steps_completed": tr.steps_completed,
                            "last_progress_ns": tr.last_progress_ns, "updated_ns": tr.now(),
                            **self.extra, "ring_entries": self.ring.maxlen,
                            "groups": {k: {"ranks": tr.group_ranks.get(k), "issued": g.issued,
                                           "completed": g.completed} for k, g in ours},
                            "other_entries": other}}

    def _size(self, key: str) -> int | None:
        return next((e["paralab"]["group_size"] for e in reversed(self.ring)
                     if e["paralab"]["group"] == key), None)

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

    def write(self, tr) -> None:
        """Both files, each written to a temporary name and renamed."""
        self.dirty = False
        for _ in range(3):  # the main thread may change the ring while it is copied: retry
            try:
                d = self.dump(tr)
                blob = pickle.dumps(d, protocol=pickle.HIGHEST_PROTOCOL)
                text = json.dumps(view(d), default=str)
                break
            except RuntimeError:
                continue
        else:  # pragma: no cover
            self.dirty = True
            return
        # one temporary per thread: the flusher and the main thread (a fault's last words, a
        # signal handler's close) may write at once; each rename is whole, the last one wins.
        # The dump's temporary lies beside OUT/flight, never in it (fr_trace reads every file)
        tid = threading.get_ident()
        dst = dump_path(self.path.parent, tr.rank)
        dst.parent.mkdir(exist_ok=True)
        for data, final, mode in ((blob, dst, "wb"), (text, self.path, "w")):
            tmp = self.path.with_name(f"{final.name}.{tid}.tmp")
            with open(tmp, mode) as f:
                f.write(data)
            os.replace(tmp, final)


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
