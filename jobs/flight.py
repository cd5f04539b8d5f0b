"""The flight recorder of one rank (the ideas of PyTorch's NCCL flight recorder; docs/faults.md):
per process group, collectives issued and completed, those entered but not completed, and a
ring of the last `RING` entries. The tracer (jobs/trace.py) feeds it from `comm_start` / `done`
and its flusher thread writes `flight-rank{R}.json` atomically whenever it changed, so a rank
blocked inside a collective still shows where it is. Standard library only.

File fields: {rank, pid, world_size, coords, step (the step the rank is in), steps_completed,
last_progress_ns (aligned clock: the last completed collective or step), updated_ns, closed
({reason, ts_ns} once the tracer closed), exit ({code, reason, step, ts_ns}: last words of a
hard exit), nonfinite ({step, what, value}: this rank saw a non-finite loss or parameters),
groups: {key: {ranks (global ranks, if known), issued, completed, open (entered, not
completed), in_flight (the oldest open entry or null), last_completed, ring}}}.
An entry: {seq, op, payload_bytes, dtype, group_size, ts_ns, step, end_ns (null: not completed)}.
"""

from __future__ import annotations

import json
import os
import threading
from collections import deque
from pathlib import Path

RING = 64  # entries kept per group


class _Group:
    __slots__ = ("issued", "completed", "open", "last", "ring")

    def __init__(self):
        self.issued = self.completed = 0
        self.open: dict[int, dict] = {}  # seq -> entry: entered, not completed
        self.last: dict | None = None
        self.ring: deque = deque(maxlen=RING)


class FlightRecorder:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.groups: dict[str, _Group] = {}
        self.extra: dict = {"closed": None, "exit": None, "nonfinite": None}
        self.dirty = True

    def next_seq(self, key: str) -> int:
        """The sequence number the next collective of group `key` gets (issued so far)."""
        g = self.groups.get(key)
        return 0 if g is None else g.issued

    def issued(self) -> dict[str, int]:
        return {k: g.issued for k, g in self.groups.items()}

    def enter(self, key: str, entry: dict) -> dict:
        g = self.groups.get(key)
        if g is None:
            g = self.groups[key] = _Group()
        g.open[entry["seq"]] = entry
        g.ring.append(entry)
        g.issued = entry["seq"] + 1
        self.dirty = True
        return entry

    def done(self, key: str, entry: dict, t_ns: int) -> int:
        """Mark `entry` completed at t_ns; returns t_ns (the tracer's new progress time)."""
        entry["end_ns"] = t_ns
        g = self.groups[key]
        g.open.pop(entry["seq"], None)
        g.completed += 1
        g.last = entry
        self.dirty = True
        return t_ns

    def state(self, tr) -> dict:
        groups = {}
        for key, g in list(self.groups.items()):
            op = list(g.open.values())
            groups[key] = {"ranks": tr.group_ranks.get(key),
                           "issued": g.issued, "completed": g.completed, "open": len(op),
                           "in_flight": min(op, key=lambda e: e["seq"]) if op else None,
                           "last_completed": g.last, "ring": list(g.ring)}
        return {"rank": tr.rank, "pid": os.getpid(), "world_size": tr.world_size,
                "coords": tr.coords, "step": tr.step, "steps_completed": tr.steps_completed,
                "last_progress_ns": tr.last_progress_ns, "updated_ns": tr.now(),
                **self.extra, "groups": groups}

    def write(self, tr) -> None:
        """flight-rank{R}.json, written to a temporary name and renamed (never half a file)."""
        self.dirty = False
        for _ in range(3):  # the main thread may change a ring while it is copied: retry
            try:
                text = json.dumps(self.state(tr), default=str)
                break
            except RuntimeError:
                continue
        else:  # pragma: no cover
            self.dirty = True
            return
        # one temporary per thread: the flusher and the main thread (a fault's last words, a
        # signal handler's close) may write at once; each rename is whole, the last one wins
        tmp = self.path.with_name(f"{self.path.name}.{threading.get_ident()}.tmp")
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, self.path)
