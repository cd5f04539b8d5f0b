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
                         `process memory` (RSS, CUDA allocator) per rank; `step scalars`
                         (step time, tokens/s, loss, RSS) of every step, traced or not
  instants ("i")         `instant` records and the `end` record (its reason)
  otherData              spec, coordinates and clock error per rank, t0_ns (time origin)
`ts` / `dur` are µs relative to the run's earliest record (absolute ns would lose precision in
a double). Standard library only.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os

from .storage.load import Traces, from_records

HOST_TID = 1
COMM_TID0 = 1000
MEM_KEYS = ("params", "grads", "optimizer", "activations", "gathered")
PROC_KEYS = ("rss_bytes", "cuda_allocated_bytes", "cuda_reserved_bytes",
             "cuda_peak_allocated_bytes")
SCALAR_KEYS = ("step_s", "tokens_per_s", "loss", "rss_bytes", "cuda_peak_allocated_bytes")
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


def _in_window(r: dict, lo: int | None, hi: int | None) -> bool:
    """A record overlapping [lo, hi] (absolute ns); instants and counters at a time in it."""
    ts = r.get("ts_ns", 0)
    return ts <= hi and ts + r.get("dur_ns", 0) >= lo


def _events(tr: Traces, t0: int, lo: int | None, hi: int | None):
    """The trace's events, rank by rank, restricted to records overlapping [lo, hi]."""
    def us(ns: int) -> float:
        return round((ns - t0) / 1000.0, 3)

    for rank, all_recs in sorted(tr.ranks.items()):
        recs = all_recs if lo is None else [r for r in all_recs if _in_window(r, lo, hi)]
        coords = tr.coords(rank)
        name = f"rank {rank}" + (f" ({_label(coords)})" if coords else "")
        yield {"ph": "M", "pid": rank, "tid": 0, "name": "process_name", "args": {"name": name}}
        yield {"ph": "M", "pid": rank, "tid": 0, "name": "process_sort_index",
               "args": {"sort_index": rank}}
        yield {"ph": "M", "pid": rank, "tid": 0, "name": "process_labels",
               "args": {"labels": ",".join(f"{k}={v}" for k, v in coords.items())}}
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
            yield x_event(r, tid, str(r.get("name", "span")), str(r.get("cat", "")))
        groups = sorted({str(r.get("group", r.get("axis", "?")))
                         for r in recs if r.get("type") == "comm"})
        for gi, g in enumerate(groups):
            comms = [(r["ts_ns"], r["ts_ns"] + r.get("dur_ns", 0), r) for r in recs
                     if r.get("type") == "comm" and str(r.get("group", r.get("axis"))) == g]
            for lane, r in assign_lanes(comms):
                tid = COMM_TID0 * (gi + 1) + lane
                threads[tid] = f"comm {g}" + (f" #{lane + 1}" if lane else "")
                yield x_event(r, tid, str(r.get("op", "comm")), "comm")
        for r in recs:
            t = r.get("type")
            if t == "mem":
                for cname, keys in (("memory", MEM_KEYS), ("process memory", PROC_KEYS)):
                    vals = {k: r[k] for k in keys if isinstance(r.get(k), int | float)}
                    if vals:
                        yield {"ph": "C", "pid": rank, "tid": 0, "name": cname,
                               "ts": us(r["ts_ns"]), "args": vals}
            elif t == "scalars":  # every step, traced or not: the run's curves in the UI
                vals = {k: r[k] for k in SCALAR_KEYS if isinstance(r.get(k), int | float)
                        and not isinstance(r.get(k), bool)}
                if vals:
                    yield {"ph": "C", "pid": rank, "tid": 0, "name": "step scalars",
                           "ts": us(r["ts_ns"]), "args": vals}
            elif t in ("instant", "end"):
                nm = str(r.get("name", "instant")) if t == "instant" else \
                    f"end: {r.get('reason')}"
                yield {"ph": "i", "s": "t", "pid": rank, "tid": HOST_TID, "name": nm,
                       "ts": us(r["ts_ns"]), "args": _args(r)}
        threads.setdefault(HOST_TID, "host")
        for tid, tname in sorted(threads.items()):
            yield {"ph": "M", "pid": rank, "tid": tid, "name": "thread_name",
                   "args": {"name": tname}}
            yield {"ph": "M", "pid": rank, "tid": tid, "name": "thread_sort_index",
                   "args": {"sort_index": tid}}


def _window(t0: int, window_ms: tuple[float, float] | None) -> tuple[int | None, int | None]:
    if window_ms is None:
        return None, None
    a, b = window_ms
    assert a < b, "window start before its end (checked by the caller)"
    return t0 + round(a * 1e6), t0 + round(b * 1e6)


def _other(tr: Traces, t0: int, spec: dict | None, window_ms) -> dict:
    return {"generator": "paralab jobs.analysis", "t0_ns": t0, "time_unit": "us from t0_ns",
            "window_ms": list(window_ms) if window_ms else None,
            "spec": spec if spec is not None else tr.spec_dict(),
            "ranks": {str(r): {"coords": tr.coords(r),
                               "clock_error_ns": (tr.meta.get(r) or {}).get("clock_error_ns"),
                               "clock": (tr.meta.get(r) or {}).get("clock")}
                      for r in sorted(tr.ranks)}}


def to_perfetto(traces, spec: dict | None = None, *,
                window_ms: tuple[float, float] | None = None) -> dict:
    """Trace Event Format dict of a run: `traces` is a load.Traces or {rank: [records]}.
    `window_ms` (ms from the trace start, the Gantt's axis): only the records overlapping it,
    times still from the run's origin so they line up with the whole run's."""
    tr = traces if isinstance(traces, Traces) else from_records(traces)
    t0 = tr.t0_ns()
    lo, hi = _window(t0, window_ms)
    return {"traceEvents": list(_events(tr, t0, lo, hi)), "displayTimeUnit": "ms",
            "otherData": _other(tr, t0, spec, window_ms)}


def iter_perfetto_json(traces, spec: dict | None = None, *,
                       window_ms: tuple[float, float] | None = None, chunk: int = 2000,
                       origin: int | None = None):
    """to_perfetto's document as JSON text in chunks of `chunk` events: what a streamed
    download (and the file the worker writes) sends without holding the document.
    `origin`: the run's time origin (ns) when `traces` holds only a window's records (a large
    run read from its Parquet files, backend/services/gantt_columnar.py)."""
    tr = traces if isinstance(traces, Traces) else from_records(traces)
    t0 = tr.t0_ns() if origin is None else origin
    lo, hi = _window(t0, window_ms)
    yield from document_chunks(_events(tr, t0, lo, hi), _other(tr, t0, spec, window_ms), chunk)


def event_chunks(events, chunk: int = 2000):
    """The inside of a JSON array of `events` (consumed lazily), as text in chunks of `chunk`
    events: the one encoder of the trace downloads (Perfetto here, Kineto in kineto_export)."""
    buf, first = [], True
    for ev in events:
        buf.append(_encode(ev))
        if len(buf) >= chunk:
            yield ("" if first else ",") + ",".join(buf)
            buf, first = [], False
    if buf:
        yield ("" if first else ",") + ",".join(buf)


def document_chunks(events, other: dict, chunk: int = 2000):
    """The Trace Event Format document of `events` (consumed lazily) and `otherData`, as
    JSON text in chunks of `chunk` events: the one writer of every Perfetto download."""
    yield '{"traceEvents":['
    yield from event_chunks(events, chunk)
    yield '],"displayTimeUnit":"ms","otherData":' + _encode(other) + "}"


_ENC = json.JSONEncoder(separators=(",", ":"), default=str, allow_nan=False)


def _strict(v):
    """v with NaN / inf as null (strict JSON: a non-finite loss in a record's args)."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: _strict(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_strict(x) for x in v]
    return v


def _encode(obj) -> str:
    try:
        return _ENC.encode(obj)
    except ValueError:
        return _ENC.encode(_strict(obj))


def write_perfetto(path, traces, spec: dict | None = None) -> None:
    """The run's Perfetto file, streamed to `path` (atomically: a `.part` file renamed), never
    holding the whole document."""
    tmp = path.with_name(path.name + ".part")
    with open(tmp, "w") as f:
        for chunk in iter_perfetto_json(traces, spec):
            f.write(chunk)
    os.replace(tmp, path)


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
    writer: every download (analysis tables, run lists) goes through it (iter_csv)."""
    cols: dict[str, None] = {}
    for r in rows:
        for k in r:
            cols.setdefault(k, None)
    return "".join(iter_csv([rows], list(cols)))


def iter_csv(batches, cols: list[str], header: list[str] | None = None):
    """CSV text chunk by chunk: the header (`header`, default `cols`: labels.csv_header names
    an analysis table's), then each batch of rows (dicts), so a table of millions of rows
    streams without being whole in memory."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([csv_cell(c) for c in header or cols])
    for rows in batches:
        for r in rows:
            w.writerow([csv_cell(r.get(c)) for c in cols])
        yield buf.getvalue()
        buf.seek(0)
        buf.truncate()
    yield buf.getvalue()


def iter_json_rows(batches):
    """json.dumps(rows) of every batch's rows together, chunk by chunk (the same text)."""
    yield "["
    first = True
    for rows in batches:
        if rows:
            yield ("" if first else ", ") + ", ".join(json.dumps(r) for r in rows)
            first = False
    yield "]"


def tables_to_csv(tables: dict, name: str, unit: str | None = None) -> str:
    """One analysis table as CSV, its header labelled by labels.csv_header (`unit`: the
    headline's throughput_unit). KeyError for an unknown table."""
    from .labels import csv_header
    cols: dict[str, None] = {}
    for r in tables[name]:
        cols.update(dict.fromkeys(r))
    return "".join(iter_csv([tables[name]], list(cols), csv_header(name, list(cols), unit)))
