"""Export: a Chrome Trace Event Format / Perfetto JSON of a whole run, and CSV of the tables.

Layout of the trace (open it in https://ui.perfetto.dev or chrome://tracing):
  one process per rank   pid = rank; `process_name` "rank R (pp=.. dp=.. tp=..)",
                         `process_labels` with the coordinates, `process_sort_index` = rank
  host thread(s)         every `span` record (step, forward, backward, F / BW, optimizer,
                         grad_sync, wait_grads, ...) as complete events ("X")
  one thread per group   every `comm` record of a process group (`group` field) as "X" events;
                         in-flight collectives overlap without nesting, so overlapping ones go
                         to extra lanes ("comm dp #2"): events on one (pid, tid) always nest
  counters ("C")         `memory` (params, grads, optimizer, activations, gathered bytes) and
                         `process memory` (RSS, CUDA allocator) per rank
  instants ("i")         `instant` records and the `end` record (its reason)
  otherData              spec, coordinates and clock error per rank, t0_ns (time origin)
`ts` / `dur` are µs relative to the run's earliest record (absolute ns would lose precision in
a double). Standard library only.
"""

from __future__ import annotations

import csv
import io
import json

from .load import Traces, from_records

HOST_TID = 1
COMM_TID0 = 1000
MEM_KEYS = ("params", "grads", "optimizer", "activations", "gathered")
PROC_KEYS = ("rss_bytes", "cuda_allocated_bytes", "cuda_reserved_bytes",
             "cuda_peak_allocated_bytes")
_SKIP_ARGS = {"type", "ts_ns", "dur_ns", "name", "cat", "rank"}


def assign_lanes(spans: list[tuple[int, int, object]]) -> list[tuple[int, object]]:
    """(start, end, item) -> (lane, item) so that the spans of one lane nest perfectly."""
    lanes: list[list[int]] = []  # per lane: stack of open ends
    out = []
    for s, e, item in sorted(spans, key=lambda x: (x[0], -x[1])):
        for i, stack in enumerate(lanes):
            while stack and stack[-1] <= s:
                stack.pop()
            if not stack or e <= stack[-1]:
                stack.append(e)
                out.append((i, item))
                break
        else:
            lanes.append([e])
            out.append((len(lanes) - 1, item))
    return out


def _label(coords: dict) -> str:
    return " ".join(f"{k}={coords[k]}" for k in ("pp", "dp", "tp") if k in coords)


def _args(r: dict) -> dict:
    return {k: v for k, v in r.items() if k not in _SKIP_ARGS and v is not None}


def to_perfetto(traces, spec: dict | None = None) -> dict:
    """Trace Event Format dict of a run: `traces` is a load.Traces or {rank: [records]}."""
    tr = traces if isinstance(traces, Traces) else from_records(traces)
    t0 = tr.t0_ns()

    def us(ns: int) -> float:
        return round((ns - t0) / 1000.0, 3)

    events: list[dict] = []
    for rank, recs in sorted(tr.ranks.items()):
        coords = tr.coords(rank)
        name = f"rank {rank}" + (f" ({_label(coords)})" if coords else "")
        events += [
            {"ph": "M", "pid": rank, "tid": 0, "name": "process_name", "args": {"name": name}},
            {"ph": "M", "pid": rank, "tid": 0, "name": "process_sort_index",
             "args": {"sort_index": rank}},
            {"ph": "M", "pid": rank, "tid": 0, "name": "process_labels",
             "args": {"labels": ",".join(f"{k}={v}" for k, v in coords.items())}}]
        threads: dict[int, str] = {}

        def x_event(r, tid, name, cat, pid=rank):
            s, e = us(r["ts_ns"]), us(r["ts_ns"] + r.get("dur_ns", 0))
            return {"ph": "X", "pid": pid, "tid": tid, "name": name, "cat": cat, "ts": s,
                    "dur": round(e - s, 3), "args": _args(r)}

        spans = [(r["ts_ns"], r["ts_ns"] + r.get("dur_ns", 0), r)
                 for r in recs if r.get("type") == "span"]
        for lane, r in assign_lanes(spans):
            tid = HOST_TID + lane
            threads[tid] = "host" if lane == 0 else f"host #{lane + 1}"
            events.append(x_event(r, tid, str(r.get("name", "span")), str(r.get("cat", ""))))
        groups = sorted({str(r.get("group", r.get("axis", "?")))
                         for r in recs if r.get("type") == "comm"})
        for gi, g in enumerate(groups):
            comms = [(r["ts_ns"], r["ts_ns"] + r.get("dur_ns", 0), r) for r in recs
                     if r.get("type") == "comm" and str(r.get("group", r.get("axis"))) == g]
            for lane, r in assign_lanes(comms):
                tid = COMM_TID0 * (gi + 1) + lane
                threads[tid] = f"comm {g}" + (f" #{lane + 1}" if lane else "")
                events.append(x_event(r, tid, str(r.get("op", "comm")), "comm"))
        for r in recs:
            t = r.get("type")
            if t == "mem":
                for cname, keys in (("memory", MEM_KEYS), ("process memory", PROC_KEYS)):
                    vals = {k: r[k] for k in keys if isinstance(r.get(k), int | float)}
                    if vals:
                        events.append({"ph": "C", "pid": rank, "tid": 0, "name": cname,
                                       "ts": us(r["ts_ns"]), "args": vals})
            elif t in ("instant", "end"):
                nm = str(r.get("name", "instant")) if t == "instant" else \
                    f"end: {r.get('reason')}"
                events.append({"ph": "i", "s": "t", "pid": rank, "tid": HOST_TID, "name": nm,
                               "ts": us(r["ts_ns"]), "args": _args(r)})
        threads.setdefault(HOST_TID, "host")
        for tid, tname in sorted(threads.items()):
            events += [{"ph": "M", "pid": rank, "tid": tid, "name": "thread_name",
                        "args": {"name": tname}},
                       {"ph": "M", "pid": rank, "tid": tid, "name": "thread_sort_index",
                        "args": {"sort_index": tid}}]
    other = {"generator": "paralab jobs.analysis", "t0_ns": t0, "time_unit": "us from t0_ns",
             "spec": spec if spec is not None else tr.spec_dict(),
             "ranks": {str(r): {"coords": tr.coords(r),
                                "clock_error_ns": (tr.meta.get(r) or {}).get("clock_error_ns"),
                                "clock": (tr.meta.get(r) or {}).get("clock")}
                       for r in sorted(tr.ranks)}}
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}


# A spreadsheet runs a cell that starts with one of these as a formula (OWASP "CSV
# injection"); such text cells get a leading apostrophe. Numbers are written as numbers.
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(v):
    """One CSV cell: None empty, nested values as compact JSON, formula-like text neutralised."""
    if v is None:
        return ""
    if isinstance(v, dict | list | tuple):
        v = json.dumps(v, separators=(",", ":"))
    if isinstance(v, str) and v.startswith(FORMULA_START):
        return "'" + v
    return v


def rows_to_csv(rows: list[dict]) -> str:
    """CSV of rows (header = the union of the rows' keys, in first-seen order). The one CSV
    writer: every download (analysis tables, run lists) goes through it."""
    cols: dict[str, None] = {}
    for r in rows:
        for k in r:
            cols.setdefault(k, None)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([csv_cell(c) for c in cols])
    for r in rows:
        w.writerow([csv_cell(r.get(c)) for c in cols])
    return buf.getvalue()


def tables_to_csv(tables: dict, name: str) -> str:
    """One analysis table as CSV. KeyError for an unknown table."""
    return rows_to_csv(tables[name])
