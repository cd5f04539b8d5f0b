"""The Gantt of a run: one window's records read from its Parquet files (a finished run's
own, a running run's scratch conversion: run_traces.source), never the whole run's unless it
fits one answer.

A whole run's trace in memory for backend/services/gantt.py's columns would cost the API about
2.3 KB a record, kept per finished run (a 50 M-record run would not fit at all). Here a
request reads only the records overlapping its window (DuckDB over the files, row groups
pruned by their `ts_ns` / `step` statistics), loads them as a sparse Traces and hands them to
the same `gantt.columns` / `gantt.gantt` (one lane rule, one drawing), with the run's time
origin and its full step list (SQL over the `step` spans, cached per file version). The
window:

- none asked: the whole run when it has at most MAX_RECORDS records (as the loaded traces'
  Gantt opens), else the middle traced step;
- `step`: that step's records;
- `t0_ms` / `t1_ms`: that range, narrowed to about MAX_RECORDS records when it holds more
  (the answer's `lod.window_capped` says so; zoom in for the rest).
"""

from __future__ import annotations

import threading
from pathlib import Path

from backend.services import gantt
from jobs.analysis import engine, perfetto
from jobs.analysis import pipeline_spans as SP
from jobs.analysis import trace_sql as V
from jobs.analysis.storage import columnar

MAX_RECORDS = 400_000  # records one Gantt answer reads at most
_CACHE: dict[tuple, dict] = {}
_LOCK = threading.Lock()
_BUILD = threading.Lock()  # one build at a time: a page's warm-up and its first request share it


def _version(run_dir: Path) -> tuple:
    files = sorted(run_dir.glob("trace-rank*" + columnar.SUFFIX))
    return (str(run_dir), tuple((p.name, p.stat().st_mtime_ns) for p in files))


def run_info(run_dir: Path) -> dict:
    """{con, meta, origin_ns, max_dur_ns, steps, records}: cached per file version."""
    key = _version(run_dir)
    with _LOCK:
        if key in _CACHE:
            return _CACHE[key]
    with _BUILD:
        with _LOCK:
            if key in _CACHE:  # built while this request waited
                return _CACHE[key]
        return _build(run_dir, key)


def _build(run_dir: Path, key: tuple) -> dict:
    con = V.connect(run_dir)
    meta = V.meta_only(run_dir)
    origin = perfetto.origin_ns(run_dir, meta)
    rows = con.execute("SELECT step, min(ts_ns), max(ts_ns + coalesce(dur_ns, 0)) FROM t "
                       "WHERE type = 'span' AND cat = 'step' AND step >= 0 "
                       "GROUP BY step ORDER BY step").fetchall()
    steps = [{"step": s, "t0_ms": (a - origin) / 1e6, "t1_ms": (b - origin) / 1e6}
             for s, a, b in rows]
    info = {"con": con, "meta": meta, "origin_ns": origin, "steps": steps,
            "records": engine.record_count(run_dir),
            "pipe_steps": [s for (s,) in con.execute(
                "SELECT DISTINCT step FROM t WHERE type = 'span' AND step >= 0 AND action IN "
                f"({SP.ACTIONS_SQL}) ORDER BY step").fetchall()],
            "max_dur_ns": perfetto.column_stat(run_dir, "dur_ns", largest=True) or 0}
    with _LOCK:
        _CACHE.clear()  # one large run at a time: its connection and step list
        _CACHE[key] = info
    return info


def _count(con, where: str) -> int:
    return con.sql(f"SELECT count(*) FROM t WHERE {where}").fetchall()[0][0]


def window_trace(run_dir: Path, step: int | None, t0_ms: float | None,
                 t1_ms: float | None) -> tuple[gantt.Trace, int | None, dict]:
    """(the window's gantt.Trace, the step it shows, what bounded it)."""
    info = run_info(run_dir)
    con, origin = info["con"].cursor(), info["origin_ns"]  # a cursor per request: threads
    capped = {"window_capped": False, "records": None}
    opening = step is None and t0_ms is None and t1_ms is None
    whole = opening and info["records"] <= MAX_RECORDS
    if opening and not whole and info["steps"]:
        step = info["steps"][len(info["steps"]) // 2]["step"]  # too large: open on one step
    if whole:  # the whole run, as the loaded traces' Gantt opens (it fits one answer)
        where = "TRUE"
    elif step is not None and t0_ms is None and t1_ms is None:
        where = f"step = {int(step)}"
    else:
        win = next((s for s in info["steps"] if s["step"] == step), None)
        lo = t0_ms if t0_ms is not None else (win["t0_ms"] if win else 0.0)
        hi = t1_ms if t1_ms is not None else (win["t1_ms"] if win else lo + 1.0)
        lo_ns, hi_ns = origin + int(lo * 1e6), origin + int(hi * 1e6)
        base = (f"ts_ns BETWEEN {lo_ns - info['max_dur_ns']} AND {hi_ns} "
                f"AND ts_ns + coalesce(dur_ns, 0) >= {lo_ns}")
        if step is not None:
            base += f" AND step = {int(step)}"
        n = _count(con, base)
        if n > MAX_RECORDS:  # narrow the window in proportion, keep its start
            hi_ns = lo_ns + int((hi_ns - lo_ns) * MAX_RECORDS / n)
            base = (f"ts_ns BETWEEN {lo_ns - info['max_dur_ns']} AND {hi_ns} "
                    f"AND ts_ns + coalesce(dur_ns, 0) >= {lo_ns}"
                    + (f" AND step = {int(step)}" if step is not None else ""))
            capped = {"window_capped": True, "records": n,
                      "t1_ms": (hi_ns - origin) / 1e6}
        where = base
    tr = engine.sparse(con, info["meta"], f"type IN ('span', 'comm') AND ({where})")
    trace = gantt.columns(tr, origin=origin)
    trace.steps = info["steps"]
    trace.pipe = (info["pipe_steps"], lambda steps: SP.stage_sums(con, steps))
    return trace, step, capped


MAX_STEPS = 2_000  # steps an answer lists (the step selector): evenly spaced beyond it


def listed_steps(steps: list[dict], keep: int | None = None) -> list[dict]:
    """At most MAX_STEPS of the run's step windows, evenly spaced, always with step `keep`
    (the one shown): a run of 10^5 steps would otherwise send megabytes of step list."""
    if len(steps) <= MAX_STEPS:
        return steps
    stride = -(-len(steps) // MAX_STEPS)
    out = steps[::stride]
    extra = [s for s in steps if s["step"] == keep and s not in out]
    return sorted(out + extra, key=lambda s: s["step"])


EXPORT_MAX_RECORDS = 5_000_000  # records one streamed Perfetto window reads at most


def export_window(run_dir: Path, t0_ms: float, t1_ms: float):
    """(the records overlapping [t0_ms, t1_ms] as a sparse Traces, the run's origin): the
    Perfetto export's window of a converted run. ValueError when it holds more than
    EXPORT_MAX_RECORDS records (the caller answers 422 on t1_ms)."""
    info = run_info(run_dir)
    con, origin = info["con"].cursor(), info["origin_ns"]
    lo_ns, hi_ns = origin + round(t0_ms * 1e6), origin + round(t1_ms * 1e6)
    where = (f"ts_ns BETWEEN {lo_ns - info['max_dur_ns']} AND {hi_ns} "
             f"AND ts_ns + coalesce(dur_ns, 0) >= {lo_ns}")
    n = _count(con, where)
    if n > EXPORT_MAX_RECORDS:
        raise ValueError(f"the window holds {n:,} records, more than {EXPORT_MAX_RECORDS:,}: "
                         "narrow it")
    return engine.sparse(con, info["meta"], where), origin


def answer(run_dir: Path, *, step, t0_ms, t1_ms, max_spans: int, px: int) -> dict:
    """GET /gantt of a large run: gantt.gantt over the window's trace."""
    trace, shown, capped = window_trace(run_dir, step, t0_ms, t1_ms)
    if capped.get("t1_ms") is not None:
        t1_ms = capped["t1_ms"]
    out = gantt.gantt(trace, step=shown, t0_ms=t0_ms, t1_ms=t1_ms, max_spans=max_spans, px=px)
    out["lod"].update(window_capped=capped["window_capped"], window_records=capped["records"],
                      columnar=True, shown_step=shown, steps_total=len(out["steps"]))
    out["steps"] = listed_steps(out["steps"], shown)
    return out
