"""Data shaped for the dashboard's charts, computed from a run's trace files (torch-free).

`load_trace(run_dir)` parses `trace-rank*.jsonl` (docs/trace-schema.md) once into numpy columns
and caches it by the files' (mtime, size). The chart views read that:

- `gantt(...)`: per-rank segments for a time window with server-side level of detail: when the
  window holds more than `max_spans` spans, spans of one (rank, lane) whose gap is below a
  bucket width are merged into one segment (the longest span names it, `n` counts them); the
  bucket doubles until the answer fits, so the response is bounded whatever the run length.
  Pipeline runs also get the theoretical schedule (`jobs.schedules.simulate`) of the step,
  timed with the measured mean stage times.
- `breakdown(...)`: per step and rank, compute / exposed communication / bubble / idle seconds.
- `comm_view(...)`: bytes per mesh axis, per-collective bus bandwidth by message size, overlap
  and exposed communication per rank, stragglers.
- `memory_view(...)`: peak memory per rank and component, measured next to predicted.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from jobs import commbytes, schedules

LANES = ("compute", "comm", "sync")  # compute spans, comm ops, comm/comm_wait phase spans
_PHASE = {"forward": "forward", "F": "forward", "backward": "backward", "BW": "backward",
          "B": "backward (input)", "W": "backward (weight)", "optimizer": "optimizer"}
MEM_COMPONENTS = ("params", "grads", "optim", "activations", "gathered_peak")
_PRED_KEY = {"params": "params", "grads": "grads", "optim": "optimizer",
             "activations": "activations"}


@dataclass
class Trace:
    origin_ns: int
    meta: dict[int, dict]
    keys: list[str]
    cols: dict[str, np.ndarray]  # rank, lane, t0, t1 (ms from origin), key, mb, step, bytes
    steps: list[dict]  # {"step", "t0_ms", "t1_ms"} over all ranks
    rank_steps: dict[tuple[int, int], tuple[float, float]]  # (rank, step) -> window
    comms: list[dict] = field(default_factory=list)
    mems: list[dict] = field(default_factory=list)
    extra: dict = field(default_factory=dict)  # per-run cache of derived views


_CACHE: OrderedDict[tuple, Trace] = OrderedDict()
_LOCK = threading.Lock()
_PARSE_LOCK = threading.Lock()


def trace_files(run_dir: Path) -> list[Path]:
    return sorted(run_dir.glob("trace-rank*.jsonl"),
                  key=lambda p: int("".join(c for c in p.stem[10:] if c.isdigit()) or 0))


def load_trace(run_dir: Path) -> Trace | None:
    files = trace_files(run_dir)
    if not files:
        return None
    key = (str(run_dir), tuple((p.name, p.stat().st_mtime_ns, p.stat().st_size) for p in files))
    with _LOCK:
        if key in _CACHE:
            _CACHE.move_to_end(key)
            return _CACHE[key]
    with _PARSE_LOCK:  # concurrent chart requests of one page wait for a single parse
        with _LOCK:
            if key in _CACHE:
                return _CACHE[key]
        trace = _parse(files)
        with _LOCK:
            _CACHE[key] = trace
            while len(_CACHE) > 6:
                _CACHE.popitem(last=False)
    return trace


def _parse(files: list[Path]) -> Trace:
    meta: dict[int, dict] = {}
    keys: dict[str, int] = {}
    col: dict[str, list] = {k: [] for k in ("rank", "lane", "ts", "end", "key", "mb", "step",
                                            "bytes")}
    rank_l, lane_l, ts_l, end_l = col["rank"], col["lane"], col["ts"], col["end"]
    key_l, mb_l, step_l, bytes_l = col["key"], col["mb"], col["step"], col["bytes"]
    comms: list[dict] = []
    mems: list[dict] = []
    step_spans: list[tuple[int, int, int, int]] = []
    loads = json.loads
    for path in files:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    r = loads(line)
                except ValueError:
                    continue  # a torn last line of a killed rank
                t = r.get("type")
                rank = r.get("rank", 0)
                if t == "meta":
                    meta[rank] = r
                    continue
                ts = r.get("ts_ns")
                if not isinstance(ts, int):
                    continue
                if t == "mem":
                    mems.append(r)
                    continue
                if t == "span":
                    cat, name = r.get("cat"), str(r.get("name", "?"))
                    if cat == "step":
                        step_spans.append((rank, r.get("step", -1), ts, ts + r.get("dur_ns", 0)))
                        continue
                    lane = 2 if cat in ("comm", "comm_wait") else 0
                    label = _PHASE.get(name, name) if lane == 0 else name
                    nbytes = 0.0
                elif t == "comm":
                    comms.append(r)
                    lane, label = 1, str(r.get("op", "?"))
                    nbytes = float(r.get("payload_bytes") or 0)
                else:
                    continue
                mb = r.get("microbatch")
                rank_l.append(rank)
                lane_l.append(lane)
                ts_l.append(ts)
                end_l.append(ts + int(r.get("dur_ns") or 0))
                key_l.append(keys.setdefault(label, len(keys)))
                mb_l.append(mb if isinstance(mb, int) else -1)
                step_l.append(r.get("step", -1))
                bytes_l.append(nbytes)
    firsts = [min(ts_l, default=None), min((x[2] for x in step_spans), default=None),
              min((m["ts_ns"] for m in mems), default=None)]
    origin = min((x for x in firsts if x is not None), default=0)

    def ms(values: list[int]) -> np.ndarray:  # integer ns -> ms from the origin, exactly
        return (np.array(values, dtype=np.int64) - origin) / 1e6
    cols = {"rank": np.array(rank_l, dtype=np.int32), "lane": np.array(lane_l, dtype=np.int8),
            "t0": ms(ts_l), "t1": ms(end_l), "key": np.array(key_l, dtype=np.int32),
            "mb": np.array(mb_l, dtype=np.int32), "step": np.array(step_l, dtype=np.int32),
            "bytes": np.array(bytes_l, dtype=np.float64)}
    order = np.lexsort((cols["t0"], cols["lane"], cols["rank"]))
    cols = {k: v[order] for k, v in cols.items()}
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
    return Trace(origin, meta, list(keys), cols, steps, rank_steps, comms, mems)


def by_rank_step(trace: Trace) -> tuple[dict[str, np.ndarray], dict[tuple[int, int], slice]]:
    """The columns sorted by (rank, step, t0) and the slice of every (rank, step)."""
    if "rs" not in trace.extra:
        c = trace.cols
        o = np.lexsort((c["t0"], c["step"], c["rank"]))
        sc = {k: v[o] for k, v in c.items()}
        n = len(o)
        if n:
            edge = np.flatnonzero(np.r_[True, (sc["rank"][1:] != sc["rank"][:-1])
                                        | (sc["step"][1:] != sc["step"][:-1])])
            ends = np.r_[edge[1:], n]
            slices = {(int(sc["rank"][a]), int(sc["step"][a])): slice(int(a), int(b))
                      for a, b in zip(edge, ends, strict=True)}
        else:
            slices = {}
        trace.extra["rs"] = (sc, slices)
    return trace.extra["rs"]


# --- interval helpers ------------------------------------------------------------------------

def _union(t0: np.ndarray, t1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint sorted intervals covering the given ones."""
    if not len(t0):
        return t0, t1
    o = np.argsort(t0, kind="stable")
    a, b = t0[o], np.maximum.accumulate(t1[o])
    start = np.r_[True, a[1:] > b[:-1]]
    idx = np.flatnonzero(start)
    return a[idx], np.r_[b[idx[1:] - 1], b[-1]]


def _clip_len(a: np.ndarray, b: np.ndarray, lo: float, hi: float) -> float:
    return float(np.clip(np.minimum(b, hi) - np.maximum(a, lo), 0, None).sum())


def _minus(a0, a1, b0, b1) -> float:
    """Length of union(a) not covered by union(b); both already disjoint and sorted."""
    total = float((a1 - a0).sum())
    covered = 0.0
    for x, y in zip(a0.tolist(), a1.tolist(), strict=True):
        i, j = np.searchsorted(b1, x, "right"), np.searchsorted(b0, y, "left")
        if j > i:
            covered += _clip_len(b0[i:j], b1[i:j], x, y)
    return total - covered


# --- level of detail -------------------------------------------------------------------------

def lod_merge(c: dict[str, np.ndarray], width: float) -> dict[str, np.ndarray]:
    """Merge spans of one (rank, lane) separated by gaps below `width` (sorted input)."""
    n = len(c["t0"])
    if n == 0 or width <= 0:
        return {**c, "n": np.ones(n, dtype=np.int32)}
    group = c["rank"].astype(np.int64) * 4 + c["lane"]
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
    ranks = sorted(set(trace.meta) | set(np.unique(trace.cols["rank"]).tolist()))
    degrees = _degrees(trace)

    def coords(r):
        return (trace.meta.get(r) or {}).get("coords") or {}
    ordered = sorted(ranks, key=lambda r: (coords(r).get("pp", 0), coords(r).get("dp", 0),
                                           coords(r).get("tp", 0), r))
    rows = []
    for y, r in enumerate(ordered):
        c = coords(r)
        parts = [f"{ax}{c[ax]}" for ax in ("pp", "dp", "tp") if degrees.get(ax, 1) > 1 and ax in c]
        rows.append({"rank": r, "coords": c, "y": y,
                     "label": f"rank {r}" + (f" ({' '.join(parts)})" if parts else "")})
    return rows


def _degrees(trace: Trace) -> dict:
    for m in trace.meta.values():
        par = (m.get("spec") or {}).get("parallel") or {}
        if par:
            return par
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
        "steps": trace.steps, "rows": rows, "keys": trace.keys, "lanes": list(LANES),
        "segments": {k: out[k].round(6).tolist() if out[k].dtype.kind == "f" else
                     out[k].tolist() for k in ("rank", "lane", "t0", "t1", "key", "mb", "step",
                                               "n", "bytes")},
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
    par = _degrees(trace)
    p, m, v = par.get("pp", 1), par.get("microbatches", 1), par.get("virtual_stages", 1)
    sched = par.get("pp_schedule", "1f1b")
    win = next((s for s in trace.steps if s["step"] == step), None)
    if p < 2 or win is None or sched not in schedules.SCHEDULES:
        return None
    c = trace.cols
    in_step = (c["step"] == step) & (c["lane"] == 0)
    stage_of = {}
    for r, meta in trace.meta.items():
        stage_of[r] = (meta.get("coords") or {}).get("pp", 0)

    def mean_ms(label: str) -> list[float] | float:
        k = trace.keys.index(label) if label in trace.keys else -1
        sel = in_step & (c["key"] == k)
        if not sel.any():
            return 0.0
        per: dict[int, list[float]] = defaultdict(list)
        for r, d in zip(c["rank"][sel].tolist(), (c["t1"] - c["t0"])[sel].tolist(), strict=True):
            per[stage_of.get(r, 0)].append(d)
        means = [sum(per[s]) / len(per[s]) if per.get(s) else None for s in range(p)]
        known = [x for x in means if x is not None]
        fill = sum(known) / len(known)
        return [(x if x is not None else fill) / 1e3 for x in means]

    place = schedules.placement_of(sched)

    def per_stage(x):  # per pipeline rank -> per global stage (the schedule's placement)
        if isinstance(x, float):
            return x
        return [x[schedules.rank_of(s, p, v, place)] for s in range(p * v)]
    t_f = per_stage(mean_ms("forward"))
    if sched in schedules.SPLIT_BACKWARD:
        t_b, t_w = per_stage(mean_ms("backward (input)")), per_stage(mean_ms("backward (weight)"))
    else:
        t_b, t_w = per_stage(mean_ms("backward")), 0.0
    try:
        sim = schedules.simulate(sched, p, m, v, t_f=t_f, t_b_input=t_b, t_b_weight=t_w)
    except ValueError:
        return None
    start = min((float(c["t0"][in_step].min()) if in_step.any() else win["t0_ms"]),
                win["t1_ms"])
    return {"schedule": sched, "p": p, "m": m, "v": v, "bubble_fraction": sim["bubble_fraction"],
            "makespan_ms": sim["makespan_s"] * 1e3, "t0_ms": start,
            "rows": [{"pp": r["rank"], "label": f"theory pp{r['rank']}",
                      "spans": [{"kind": s["kind"], "mb": s["mb"], "chunk": s["chunk"],
                                 "t0_ms": start + s["start"] * 1e3,
                                 "t1_ms": start + s["end"] * 1e3} for s in r["spans"]]}
                     for r in sim["ranks"]]}


# --- step-time breakdown, communication, memory ------------------------------------------------

def breakdown(trace: Trace) -> dict:
    """Per (step, rank): step time split into compute, exposed comm, bubble and idle seconds.

    compute = union of compute spans; exposed comm = comm (ops and sync spans) not overlapped by
    compute; bubble (pipeline runs) = the rest between the rank's first and last compute of the
    step; idle = what remains of the step."""
    pipeline = _degrees(trace).get("pp", 1) > 1
    p2p = [i for i, k in enumerate(trace.keys) if k in ("send", "recv") and pipeline]
    if "breakdown" in trace.extra:
        return trace.extra["breakdown"]
    sc, slices = by_rank_step(trace)
    rows = []
    for (r, s), (a, b) in sorted(trace.rank_steps.items(), key=lambda x: (x[0][1], x[0][0])):
        if s < 0:
            continue
        sl = slices.get((r, s), slice(0, 0))
        c = {k: v[sl] for k, v in sc.items()}
        m = np.ones(len(c["t0"]), dtype=bool)
        comp = m & (c["lane"] == 0)
        k0, k1 = _union(np.clip(c["t0"][comp], a, b), np.clip(c["t1"][comp], a, b))
        cm = m & (c["lane"] > 0) & ~np.isin(c["key"], p2p)  # p2p waits are pipeline bubble
        m0, m1 = _union(np.clip(c["t0"][cm], a, b), np.clip(c["t1"][cm], a, b))
        compute = float((k1 - k0).sum())
        comm = float((m1 - m0).sum())
        exposed = _minus(m0, m1, k0, k1)
        bubble = 0.0
        if pipeline and len(k0):
            span_busy = float(k1[-1] - k0[0])
            bubble = max(span_busy - compute - _minus_within(m0, m1, k0, k1, k0[0], k1[-1]),
                         0.0)
        step_ms = b - a
        idle = max(step_ms - compute - exposed - bubble, 0.0)
        rows.append({"step": s, "rank": r, "step_s": step_ms / 1e3, "compute_s": compute / 1e3,
                     "comm_s": comm / 1e3, "exposed_comm_s": exposed / 1e3,
                     "bubble_s": bubble / 1e3, "idle_s": idle / 1e3,
                     "overlap_pct": 100.0 * (comm - exposed) / comm if comm > 0 else None})
    means = {}
    for key in ("step_s", "compute_s", "comm_s", "exposed_comm_s", "bubble_s", "idle_s"):
        vals = [x[key] for x in rows]
        means[key] = sum(vals) / len(vals) if vals else None
    trace.extra["breakdown"] = {"rows": rows, "mean": means, "pipeline": pipeline}
    return trace.extra["breakdown"]


def _minus_within(m0, m1, k0, k1, lo, hi) -> float:
    """Exposed comm (comm not under compute) that lies inside [lo, hi]."""
    a0, a1 = np.clip(m0, lo, hi), np.clip(m1, lo, hi)
    keep = a1 > a0
    return _minus(a0[keep], a1[keep], k0, k1)


def comm_view(trace: Trace) -> dict:
    axis = defaultdict(float)
    coll: dict[tuple, list] = defaultdict(list)
    for r in trace.comms:
        axis[(r.get("rank", 0), str(r.get("axis", "?")))] += float(r.get("bytes_sent") or 0)
        dur = r.get("dur_ns") or 0
        if dur > 0 and r.get("payload_bytes"):
            coll[(str(r.get("op")), str(r.get("axis", "?")), int(r["payload_bytes"]),
                  int(r.get("group_size") or 1))].append(dur)
    collectives = []
    for (op, ax, size, n), durs in sorted(coll.items()):
        mean_s = sum(durs) / len(durs) / 1e9
        try:
            factor = float(commbytes.busbw_factor(op, n))
        except ValueError:
            factor = 1.0
        collectives.append({"op": op, "axis": ax, "bytes": size, "group_size": n,
                            "count": len(durs), "time_us_mean": mean_s * 1e6,
                            "time_us_min": min(durs) / 1e3, "algbw_GBps": size / mean_s / 1e9,
                            "busbw_GBps": size * factor / mean_s / 1e9})
    per: dict[int, dict] = defaultdict(lambda: defaultdict(float))
    for x in breakdown(trace)["rows"]:
        for k in ("step_s", "compute_s", "comm_s", "exposed_comm_s", "bubble_s", "idle_s"):
            per[x["rank"]][k] += x[k]
    ranks = []
    for r in sorted(per):
        d = per[r]
        ranks.append({"rank": r, **{k: d[k] for k in d},
                      "overlap_pct": 100 * (d["comm_s"] - d["exposed_comm_s"]) / d["comm_s"]
                      if d["comm_s"] > 0 else None})
    if ranks:  # a straggler computes clearly longer than the median rank, the others wait on it
        med = float(np.median([x["compute_s"] for x in ranks]))
        for x in ranks:
            x["straggler"] = bool(len(ranks) > 1 and med > 0 and x["compute_s"] > 1.1 * med)
    return {"axis_bytes": [{"rank": r, "axis": a, "bytes_sent": b}
                           for (r, a), b in sorted(axis.items())],
            "collectives": collectives, "ranks": ranks}


def memory_view(trace: Trace | None, prediction: dict | None) -> dict:
    """Rows {rank, component, measured_bytes, predicted_bytes, error_pct}: the peak of each
    component over the run's `mem` samples next to the theory model's figure for that rank."""
    peaks: dict[int, dict[str, float]] = defaultdict(dict)
    for r in (trace.mems if trace else []):
        for comp in MEM_COMPONENTS:
            if isinstance(r.get(comp), (int, float)):
                d = peaks[r.get("rank", 0)]
                d[comp] = max(d.get(comp, 0), r[comp])
    pred_c = ((prediction or {}).get("memory") or {}).get("components") or {}
    per_pp = ((prediction or {}).get("params") or {}).get("per_pipeline_rank") or []
    rows = []
    for rank in sorted(peaks):
        pp = ((trace.meta.get(rank) or {}).get("coords") or {}).get("pp", 0)
        scale = per_pp[pp] / max(per_pp) if per_pp and pp < len(per_pp) and max(per_pp) else 1
        for comp, measured in peaks[rank].items():
            key = _PRED_KEY.get(comp)
            pred = pred_c.get(key) if key else None
            if pred is not None and comp != "activations":
                pred = pred * scale
            err = 100.0 * (measured - pred) / pred if pred else None
            rows.append({"rank": rank, "component": "gathered" if comp == "gathered_peak"
                         else comp, "measured_bytes": measured, "predicted_bytes": pred,
                         "error_pct": err})
    return {"columns": ["rank", "component", "measured_bytes", "predicted_bytes", "error_pct"],
            "rows": rows, "source": "trace mem records + jobs.theory.predict(spec)"}


def to_csv(rows: list[dict]) -> str:
    import csv
    import io
    if not rows:
        return ""
    buf = io.StringIO()
    cols = list(dict.fromkeys(k for r in rows for k in r))
    w = csv.DictWriter(buf, fieldnames=cols, extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow({k: _csv_safe(v) for k, v in r.items()})
    return buf.getvalue()


def _csv_safe(v):
    """Neutralise spreadsheet formulas in text cells."""
    if isinstance(v, str) and v[:1] in ("=", "+", "-", "@"):
        return "'" + v
    return v
