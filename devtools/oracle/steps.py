"""The oracle's step tables: step_rank, ranks, throughput and the trace coverage from loaded
records (jobs.analysis.storage.load's Traces), by the definitions of jobs/analysis/steps.py (its
docstring) written out record by record in the standard library. Independent of the columnar
engine (jobs/analysis/step_sweep.py, step_tables.py), which the tests compare with it.
"""

from __future__ import annotations

from collections import defaultdict

from jobs.analysis import finished as F
from jobs.analysis import intervals as iv
from jobs.analysis import rules
from jobs.analysis.steps import (
    COMPUTE_CATS,
    NS,
    SUMMED,
    _end,
    is_blocking,
    no_step_span,
    pipeline_key,
    pipeline_windows,
    tokens_per_step,
)
from jobs.analysis.storage.load import Traces
from jobs.trace_schedule import compact_ranges


def group_by_step(recs: list[dict]) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = defaultdict(list)
    for r in recs:
        st = r.get("step")
        if isinstance(st, int) and st >= 0 and r.get("type") in ("span", "comm", "mem"):
            out[st].append(r)
    return out


def step_row(step: int, rank: int, coords: dict, recs: list[dict],
             window: tuple[int, int] | None = None,
             rank_compute: list[tuple[int, int]] | None = None) -> dict | None:
    """One row of the step_rank table from one rank's records of one step; `window` is the
    step's pipeline window (pipeline runs only) and `rank_compute` the rank's merged compute
    spans of every step (a pipeline window can overlap the rank's previous optimizer step:
    that rank is busy then, not in a bubble)."""
    timed = [r for r in recs if r.get("type") in ("span", "comm")]
    if not timed:
        return None
    steps = [r for r in timed if r.get("type") == "span" and r.get("cat") == "step"]
    if steps:
        t0, t1 = steps[0]["ts_ns"], _end(steps[0])
    else:
        t0, t1 = min(r["ts_ns"] for r in timed), max(_end(r) for r in timed)
    comp_spans = [(r["ts_ns"], _end(r)) for r in timed
                  if r["type"] == "span" and r.get("cat") in COMPUTE_CATS]
    comms = [r for r in timed if r["type"] == "comm"]
    blocking = iv.union((c["ts_ns"], _end(c)) for c in comms if is_blocking(c, comp_spans))
    compute = iv.clip(iv.subtract(iv.union(comp_spans), blocking), t0, t1)
    comm = iv.clip(iv.union((c["ts_ns"], _end(c)) for c in comms), t0, t1)
    bubble, pipe_idle = [], []
    if window is not None:  # the simulator's convention: idle inside the whole window ...
        pipe_idle = iv.subtract([window], rank_compute if rank_compute is not None
                                else iv.union(comp_spans))
        bubble = iv.clip(pipe_idle, t0, t1)  # ... of which the part inside this rank's step
    exposed = iv.subtract(iv.subtract(comm, compute), bubble)
    overlap = iv.length(iv.intersect(compute, comm))
    comm_ns, comp_ns = iv.length(comm), iv.length(compute)
    busy = iv.length(iv.union(compute + comm + bubble))
    return {"step": step, "rank": rank, "coords": coords, "pp": coords.get("pp"),
            "dp": coords.get("dp"), "tp": coords.get("tp"),
            "step_s": (t1 - t0) / NS, "compute_s": comp_ns / NS, "comm_s": comm_ns / NS,
            "overlap_s": overlap / NS, "exposed_comm_s": iv.length(exposed) / NS,
            "bubble_s": iv.length(bubble) / NS if window is not None else None,
            "pipeline_window_s": (window[1] - window[0]) / NS if window is not None else None,
            "pipeline_idle_s": iv.length(pipe_idle) / NS if window is not None else None,
            "idle_s": max(0, (t1 - t0) - busy) / NS,
            "overlap_pct": 100.0 * overlap / comm_ns if comm_ns else None,
            "comm_ops": len(comms), "has_step_span": bool(steps),
            # the job's loss over this rank's samples, and its share of the global-batch loss
            # (jobs.summary.loss_weight): on the ranks whose loss counts
            "loss": steps[0].get("loss") if steps else None,
            "loss_weight": steps[0].get("loss_weight") if steps else None}


def step_rank_table(tr: Traces) -> list[dict]:
    rows = []
    missing = 0
    windows = pipeline_windows(tr)
    for rank, recs in sorted(tr.ranks.items()):
        coords = tr.coords(rank)
        key = pipeline_key(coords)
        busy = iv.union((r["ts_ns"], _end(r)) for r in recs if r.get("type") == "span"
                        and r.get("cat") in COMPUTE_CATS) if windows else None
        for step, srecs in sorted(group_by_step(recs).items()):
            row = step_row(step, rank, coords, srecs, windows.get((step, key)), busy)
            if row is not None:
                missing += not row["has_step_span"]
                rows.append(row)
    if missing:
        tr.warnings.append(no_step_span(missing))
    return rows


def ranks_table(step_rows: list[dict]) -> list[dict]:
    """Per rank over the steady steps (rules.steady): the step-time breakdown as a mean per
    step, and the rank's overlap share. What the time-per-rank chart draws."""
    use = set(rules.steady(r["step"] for r in step_rows))
    acc: dict[int, dict] = {}
    for r in step_rows:
        if r["step"] not in use:
            continue
        a = acc.setdefault(r["rank"], {"rank": r["rank"], "coords": r["coords"], "steps": 0,
                                       **{k: 0.0 for k in SUMMED}, "pipeline": False})
        a["steps"] += 1
        for k in SUMMED:
            a[k] += r[k] or 0.0
        a["pipeline"] |= r["bubble_s"] is not None
    out = []
    for rank in sorted(acc):
        a = acc[rank]
        n = a.pop("steps")
        pipe = a.pop("pipeline")
        row = {"rank": rank, "coords": a["coords"], "steady_steps": n}
        row.update({f"{k[:-2]}_mean_s": a[k] / n for k in SUMMED})
        if not pipe:
            row["bubble_mean_s"] = None
        row["overlap_pct"] = 100.0 * a["overlap_s"] / a["comm_s"] if a["comm_s"] else None
        out.append(row)
    return out


def traced_losses(step_rows: list[dict]) -> dict[int, float]:
    """Global-batch loss per step from the `step` spans (what a run that never wrote its
    summary still has): the weighted sum of the ranks' losses, for the steps where every
    rank that counts finished (weights summing to 1)."""
    acc: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for r in sorted(step_rows, key=lambda r: (r["step"], r["rank"])):
        if r.get("loss") is not None and r.get("loss_weight"):
            a = acc[r["step"]]
            a[0] += r["loss_weight"] * r["loss"]
            a[1] += r["loss_weight"]
    return {s: v for s, (v, w) in acc.items() if abs(w - 1.0) < 1e-9}


def scalar_rows(tr: Traces) -> list[dict]:
    """Per (step, rank): the `scalars` record (every step, traced or not; none in traces
    written before bounded tracing)."""
    rows = []
    for rank, recs in sorted(tr.ranks.items()):
        for r in recs:
            st = r.get("step")
            if r.get("type") == "scalars" and isinstance(st, int) and st >= 0:
                rows.append({"step": st, "rank": rank, "step_s": r.get("step_s"),
                             "loss": r.get("loss"), "loss_weight": r.get("loss_weight"),
                             "traced": bool(r.get("traced", True))})
    return rows


def trace_coverage(tr: Traces, step_rows: list[dict], scalars: list[dict]) -> dict:
    """Which steps have detailed records (`traced_steps`, compact ranges, over any rank) and
    how many steps the run has scalars for; `capped_ranks`: ranks whose max_records cap
    stopped detailed tracing."""
    traced = sorted({r["step"] for r in step_rows})
    every = sorted({r["step"] for r in scalars} | set(traced))
    capped = sorted(rank for rank, recs in tr.ranks.items()
                    if any(r.get("type") == "instant" and r.get("name") == "trace_capped"
                           for r in recs))
    return {"traced_steps": compact_ranges(traced), "traced_step_count": len(traced),
            "steps": len(every), "untraced_step_count": len(set(every) - set(traced)),
            "capped_ranks": capped}


def throughput_table(step_rows: list[dict], spec: dict | None, summary: dict | None,
                     scalars: list[dict] | None = None,
                     warnings: list[str] | None = None) -> list:
    """Per step: step time (slowest rank's step span; on an untraced step the slowest rank's
    `scalars` step time), tokens/s, loss (summary.json's, else from the traces: a cancelled
    or live run), `traced` (the step has detailed records). Steps not every rank finished
    are left out (unfinished_steps)."""
    bad = F.unfinished_steps(F.step_marks(step_rows, scalars), warnings)
    by_step: dict[int, list[float]] = defaultdict(list)
    for r in step_rows:
        by_step[r["step"]].append(r["step_s"])
    traced_set = set(by_step)
    for r in scalars or []:
        if r["step"] not in traced_set and isinstance(r.get("step_s"), int | float):
            by_step[r["step"]].append(r["step_s"])
    losses = (summary or {}).get("loss") or []
    first = 0  # the first step losses[] covers
    if losses:  # summary's loss[i] is global step start_step + i (a resumed run's own steps):
        # numbered as the step times are, so every chart of the run shares one step axis
        first = int((summary or {}).get("start_step") or 0)
        losses = [None] * first + list(losses)
    else:
        traced = traced_losses(scalars or step_rows)
        losses = [traced.get(s) for s in range(max(traced) + 1)] if traced else []
    tokens = tokens_per_step(spec)
    rows = []
    for step in sorted((set(by_step) | set(range(first, len(losses)))) - bad):
        t = max(by_step[step]) if by_step.get(step) else None
        loss = losses[step] if step < len(losses) else None
        rows.append({"step": step, "step_s": t, "ranks": len(by_step.get(step, [])),
                     "tokens": tokens,
                     "tokens_per_s": tokens / t if tokens and t else None,
                     "loss": loss if isinstance(loss, int | float) else None,
                     "traced": step in traced_set})
    return rows
