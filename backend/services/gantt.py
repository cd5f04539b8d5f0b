"""The dashboard's Gantt: per-rank segments of a time window with server-side level of detail.

Dashboard-only (drawing, not metrics): every figure the run page prints comes from
`jobs.analysis` (backend/services/run_traces.py serves it). The segments are columns derived
from a window of the run's records (backend/services/gantt_columnar.py reads it from the
Parquet files, a finished run's or a running run's scratch copy):

- `gantt(...)`: when the window holds more than `max_spans` spans, spans of one (rank, lane)
  whose gap is below a bucket width are merged into one segment (the longest span names it,
  `n` counts them); the bucket doubles until the answer fits, so the response is bounded
  whatever the run length. Pipeline runs also get the schedule the analysis simulates with the
  run's own stage times (`jobs.analysis.pipeline.simulation`), drawn from the step's first
  action, so its bubble is the one the run page's bubble card shows as "simulated".
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from jobs.analysis import Traces, rules
from jobs.analysis import pipeline as PL
from jobs.analysis.predicted import spec_of
from jobs.analysis.steps import pipeline_windows

_PHASE = {"forward": "forward", "F": "forward", "backward": "backward", "BW": "backward",
          "B": "backward (input)", "W": "backward (weight)", "optimizer": "optimizer"}
# Lanes of a rank, top to bottom: its compute (nested spans carry a depth), its phase spans
# (grad_sync / wait_grads), then one lane per communication axis (dp, tp, pp: point-to-point
# send / recv included, ...). Each lane is a labelled row of the chart. An imported GPU trace
# (records with a `stream`, jobs/kineto/convert.py) has one lane per GPU stream instead.
COMPUTE, PHASES = "compute", "sync"
_AXIS_ORDER = {"dp": 0, "tp": 1, "pp": 2}


@dataclass
class Trace:
    """Gantt columns of a run: rank, lane (index into `lanes`), depth (nesting in the lane),
    t0, t1 (ms from origin), key, mb, step, bytes."""

    origin_ns: int
    meta: dict[int, dict]
    keys: list[str]
    cols: dict[str, np.ndarray]
    steps: list[dict]  # {"step", "t0_ms", "t1_ms"} over all ranks
    rank_steps: dict[tuple[int, int], tuple[float, float]]  # (rank, step) -> window
    lanes: list[dict] = field(default_factory=list)  # {id, rank, channel, label, y}
    source: Traces | None = None
    extra: dict = field(default_factory=dict)
    # a window of a larger run (gantt_columnar): the run's pipeline steps and its action spans'
    # sums per step list, so the simulated schedule is the analysis' over the run's steady
    # steps, not over the window's
    pipe: tuple | None = None


def columns(tr: Traces, origin: int | None = None) -> Trace:
    """The Gantt's columns from loaded traces (step spans become the step windows).
    `origin`: the run's time origin in ns (default tr.t0_ns(); a window's records need the
    whole run's, backend/services/gantt_columnar.py)."""
    keys: dict[str, int] = {}
    col: dict[str, list] = {k: [] for k in ("rank", "channel", "ts", "end", "key", "mb", "step",
                                            "bytes")}
    step_spans: list[tuple[int, int, int, int]] = []
    for rank, recs in tr.ranks.items():
        for r in recs:
            t, ts = r.get("type"), r.get("ts_ns")
            if not isinstance(ts, int):
                continue
            if t == "span":
                cat, name = r.get("cat"), str(r.get("name", "?"))
                if cat == "step":
                    step_spans.append((rank, r.get("step", -1), ts, ts + r.get("dur_ns", 0)))
                    continue
                lane = PHASES if cat in ("comm", "comm_wait") else COMPUTE
                label = _PHASE.get(name, name) if lane == COMPUTE else name
                if name == "cp.step":  # ring attention: one span per ring step (context.py)
                    label = f"ring {r.get('phase', '?')} step {r.get('cp_step', '?')}"
                nbytes = 0.0
            elif t == "comm":
                lane, label = f"comm {r.get('axis', '?')}", str(r.get("op", "?"))
                if r.get("axis") == "cp":  # the K / V block (dK / dV in backward) in flight
                    label = f"{label} {r.get('what', '?')}"
                nbytes = float(r.get("payload_bytes") or 0)
            else:
                continue
            if isinstance(r.get("stream"), int):  # an imported GPU trace: a lane per stream
                lane = f"stream {r['stream']}"
            mb = r.get("microbatch")
            col["rank"].append(rank)
            col["channel"].append(lane)
            col["ts"].append(ts)
            col["end"].append(ts + int(r.get("dur_ns") or 0))
            col["key"].append(keys.setdefault(label, len(keys)))
            col["mb"].append(mb if isinstance(mb, int) else -1)
            col["step"].append(r.get("step", -1))
            col["bytes"].append(nbytes)
    origin = tr.t0_ns() if origin is None else origin

    def ms(values: list[int]) -> np.ndarray:  # integer ns -> ms from the origin, exactly
        return (np.array(values, dtype=np.int64) - origin) / 1e6
    meta = dict(tr.meta)
    lanes = _lanes(meta, col["rank"], col["channel"])
    lane_of = {(ln["rank"], ln["channel"]): ln["id"] for ln in lanes}
    cols = {"rank": np.array(col["rank"], dtype=np.int32),
            "lane": np.array([lane_of[k] for k in zip(col["rank"], col["channel"], strict=True)],
                             dtype=np.int32), "t0": ms(col["ts"]),
            "t1": ms(col["end"]), "key": np.array(col["key"], dtype=np.int32),
            "mb": np.array(col["mb"], dtype=np.int32),
            "step": np.array(col["step"], dtype=np.int32),
            "bytes": np.array(col["bytes"], dtype=np.float64)}
    order = np.lexsort((-cols["t1"], cols["t0"], cols["lane"]))
    cols = {k: v[order] for k, v in cols.items()}
    cols["depth"] = _depths(cols["lane"], cols["t0"], cols["t1"])
    rank_steps = {(r, s): ((a - origin) / 1e6, (b - origin) / 1e6) for r, s, a, b in step_spans}
    if not rank_steps and len(cols["t0"]):  # no step spans: a step is its records' extent
        for r, s in set(zip(cols["rank"].tolist(), cols["step"].tolist(), strict=True)):
            sel = (cols["rank"] == r) & (cols["step"] == s)
            rank_steps[(r, s)] = (float(cols["t0"][sel].min()), float(cols["t1"][sel].max()))
    by_step: dict[int, list[float]] = {}
    for (_, s), (a, b) in rank_steps.items():
        w = by_step.setdefault(s, [a, b])
        w[0], w[1] = min(w[0], a), max(w[1], b)
    steps = [{"step": s, "t0_ms": w[0], "t1_ms": w[1]} for s, w in sorted(by_step.items())
             if s >= 0]
    return Trace(origin, meta, list(keys), cols, steps, rank_steps, lanes, tr)


def _lanes(meta: dict, ranks: list[int], channels: list[str]) -> list[dict]:
    """The chart's rows: per rank (mesh order) its compute lane, phase lane and one lane per
    communication axis it used, with a label and a y (ranks separated by a gap)."""
    present: dict[int, set] = {}
    for r, ch in zip(ranks, channels, strict=True):
        present.setdefault(r, set()).add(ch)
    rows = _rank_rows(meta, set(present))
    lanes, y = [], 0.0
    for row in rows:
        chans = present.get(row["rank"], {COMPUTE})
        streams = sorted((c for c in chans if c.startswith("stream ")),
                         key=lambda c: int(c.split()[1]))
        order = ([COMPUTE] if COMPUTE in chans or not streams else []) + streams + (
            [PHASES] if PHASES in chans else []) + sorted(
            (c for c in chans if c.startswith("comm ")),
            key=lambda c: (_AXIS_ORDER.get(c[5:], 9), c))
        for i, ch in enumerate(order):
            lanes.append({"id": len(lanes), "rank": row["rank"], "channel": ch, "y": y,
                          "label": row["label"] if ch == COMPUTE else
                          f"{row['label']} {ch}" if i == 0 else f"  {ch}"})
            y += 1.0
        y += 0.5
    return lanes


def _depths(lane: np.ndarray, t0: np.ndarray, t1: np.ndarray) -> np.ndarray:
    """Nesting depth of each span in its lane (input sorted by lane, start, longest first):
    how many earlier spans of the lane are still open when it starts."""
    depth = np.zeros(len(t0), dtype=np.int8)
    stack: list[float] = []
    prev = None
    for i, (ln, a, b) in enumerate(zip(lane.tolist(), t0.tolist(), t1.tolist(), strict=True)):
        if ln != prev:
            stack, prev = [], ln
        while stack and stack[-1] <= a:
            stack.pop()
        depth[i] = min(len(stack), 3)
        stack.append(b)
    return depth


# --- level of detail -------------------------------------------------------------------------

def _union(t0: np.ndarray, t1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint sorted intervals covering the given ones."""
    if not len(t0):
        return t0, t1
    o = np.argsort(t0, kind="stable")
    a, b = t0[o], np.maximum.accumulate(t1[o])
    start = np.r_[True, a[1:] > b[:-1]]
    idx = np.flatnonzero(start)
    return a[idx], np.r_[b[idx[1:] - 1], b[-1]]


def lod_merge(c: dict[str, np.ndarray], width: float) -> dict[str, np.ndarray]:
    """Merge spans of one (rank, lane) separated by gaps below `width` (sorted input)."""
    n = len(c["t0"])
    if n == 0 or width <= 0:
        return {**c, "n": np.ones(n, dtype=np.int32)}
    group = c["lane"].astype(np.int64)
    shift = group * 1e12  # per-group running max via an offset larger than any time
    runmax = np.maximum.accumulate(c["t1"] + shift) - shift
    new = np.r_[True, (group[1:] != group[:-1]) | (c["t0"][1:] - runmax[:-1] >= width)]
    cid = np.cumsum(new) - 1
    starts = np.flatnonzero(new)
    dur = c["t1"] - c["t0"]
    pick = np.lexsort((dur, cid))  # last element of each cluster = its longest span
    last = np.r_[np.flatnonzero(cid[pick][1:] != cid[pick][:-1]), n - 1]
    dom = pick[last]
    out = {k: v[dom] for k, v in c.items()}
    out["t0"] = c["t0"][starts]
    out["t1"] = np.maximum.reduceat(c["t1"], starts)
    out["bytes"] = np.add.reduceat(c["bytes"], starts)
    out["n"] = np.diff(np.r_[starts, n]).astype(np.int32)
    return out


def rows_of(trace: Trace) -> list[dict]:
    """One entry per rank (mesh order): rank, coords, label, and y of its first lane."""
    first = {}
    for ln in trace.lanes:
        first.setdefault(ln["rank"], ln["y"])
    return [{**row, "y": first.get(row["rank"], row["y"])}
            for row in _rank_rows(trace.meta, set(first))]


def _rank_rows(meta: dict, extra_ranks: set) -> list[dict]:
    ranks = sorted(set(meta) | set(extra_ranks))
    degrees = _degrees(meta)

    def coords(r):
        return (meta.get(r) or {}).get("coords") or {}
    ordered = sorted(ranks, key=lambda r: (coords(r).get("pp", 0), coords(r).get("dp", 0),
                                           coords(r).get("tp", 0), r))
    rows = []
    for y, r in enumerate(ordered):
        c = coords(r)
        parts = [f"{ax}{c[ax]}" for ax in ("pp", "dp", "tp") if degrees.get(ax, 1) > 1 and ax in c]
        rows.append({"rank": r, "coords": c, "y": y,
                     "label": f"rank {r}" + (f" ({' '.join(parts)})" if parts else "")})
    return rows


def _degrees(meta: dict) -> dict:
    for m in meta.values():
        par = (m.get("spec") or {}).get("parallel") or {}
        if par:  # the degrees only (the loader checked the shapes down to `parallel`)
            return {k: v for k, v in par.items() if type(v) is int}
    return {}


def gantt(trace: Trace, *, step: int | None = None, t0_ms: float | None = None,
          t1_ms: float | None = None, max_spans: int = 20000, px: int = 2000) -> dict:
    c = trace.cols
    sel = np.ones(len(c["t0"]), dtype=bool)
    lo = float(c["t0"].min()) if len(c["t0"]) else 0.0
    hi = float(c["t1"].max()) if len(c["t1"]) else 1.0
    if step is not None:
        sel &= c["step"] == step
        win = next((s for s in trace.steps if s["step"] == step), None)
        if win:
            lo, hi = win["t0_ms"], win["t1_ms"]
    if t0_ms is not None:
        lo = max(lo, t0_ms) if step is not None else t0_ms
    if t1_ms is not None:
        hi = min(hi, t1_ms) if step is not None else t1_ms
    hi = max(hi, lo + 1e-6)
    sel &= (c["t1"] >= lo) & (c["t0"] <= hi)
    win_cols = {k: v[sel] for k, v in c.items()}
    total = int(sel.sum())
    width = 0.0
    out = lod_merge(win_cols, 0.0)
    if total > max_spans:
        width = (hi - lo) / px
        out = lod_merge(win_cols, width)
        while len(out["t0"]) > max_spans:
            width *= 2
            out = lod_merge(win_cols, width)
    rows = rows_of(trace)
    return {
        "window": {"t0_ms": lo, "t1_ms": hi}, "origin_ns": trace.origin_ns,
        "steps": trace.steps, "rows": rows, "keys": trace.keys, "lanes": trace.lanes,
        "segments": {k: out[k].round(6).tolist() if out[k].dtype.kind == "f" else
                     out[k].tolist() for k in ("rank", "lane", "depth", "t0", "t1", "key", "mb",
                                               "step", "n", "bytes")},
        "idle": _idle(trace, lo, hi, max(width, (hi - lo) / px / 4), step),
        "total_spans": total, "returned": len(out["t0"]),
        "lod": {"merged": width > 0, "bucket_ms": width, "max_spans": max_spans},
        "theory": _theory(trace, step) if step is not None else None,
    }


def _idle(trace: Trace, lo: float, hi: float, min_gap: float, step, limit=20000) -> dict:
    """Gaps inside each rank's step windows where it neither computes nor communicates:
    per rank, the complement of (its spans + the time outside its steps), vectorised."""
    c = trace.cols
    out = {"rank": [], "t0": [], "t1": []}
    for r in np.unique(c["rank"]).tolist():
        wins = sorted(w for (rr, s), w in trace.rank_steps.items()
                      if rr == r and s >= 0 and (step is None or s == step))
        if not wins:
            continue
        w0 = np.array([w[0] for w in wins])
        w1 = np.array([w[1] for w in wins])
        m = (c["rank"] == r) & (c["t1"] >= max(lo, w0[0])) & (c["t0"] <= min(hi, w1[-1]))
        outside0 = np.r_[-np.inf, w1]  # the time between and around the rank's steps
        outside1 = np.r_[w0, np.inf]
        u0, u1 = _union(np.r_[c["t0"][m], outside0], np.r_[c["t1"][m], outside1])
        g0, g1 = np.maximum(u1[:-1], lo), np.minimum(u0[1:], hi)
        keep = (g1 - g0) >= max(min_gap, 1e-9)
        out["rank"] += [r] * int(keep.sum())
        out["t0"] += g0[keep].round(6).tolist()
        out["t1"] += g1[keep].round(6).tolist()
    if len(out["t0"]) > limit:  # keep the longest gaps
        top = np.sort(np.argsort(np.subtract(out["t1"], out["t0"]))[-limit:])
        out = {k: [v[i] for i in top.tolist()] for k, v in out.items()}
    return out


def _theory(trace: Trace, step: int) -> dict | None:
    """The analysis' simulated schedule (steady-step mean stage times, the run's: `trace.pipe`
    for a window of it), drawn from the first pipeline action of `step`."""
    tr = trace.source
    if tr is None:
        return None
    lay = PL.layout(tr, spec_of(tr.spec_dict(), []), None)
    if lay is None:
        return None
    sched, p, m, v = lay
    windows = pipeline_windows(tr)
    run_steps, spans = trace.pipe if trace.pipe is not None else (
        [s for s, _ in windows], None)
    steps = rules.steady(run_steps)
    starts = [w[0] for (s, _), w in windows.items() if s == step]
    if not starts:
        return None
    try:
        sim = PL.simulation(tr, lay, steps, spans)
    except ValueError:
        return None
    if sim is None:
        return None
    start = (min(starts) - trace.origin_ns) / 1e6
    return {"schedule": sched, "p": p, "m": m, "v": v, "bubble_fraction": sim["bubble_fraction"],
            "stage_times_steps": rules.steady_range(steps),
            "makespan_ms": sim["makespan_s"] * 1e3, "t0_ms": start,
            "rows": [{"pp": r["rank"], "label": f"theory pp{r['rank']}",
                      "spans": [{"kind": s["kind"], "mb": s["mb"], "chunk": s["chunk"],
                                 "t0_ms": start + s["start"] * 1e3,
                                 "t1_ms": start + s["end"] * 1e3} for s in r["spans"]]}
                     for r in sim["ranks"]]}
