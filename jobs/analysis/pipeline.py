"""Per pipeline stage: measured bubble, split into schedule-inherent and stall.

Measured (jobs.bubbles.stage_bubbles, helper-4's module, reused as is): per step the window
runs from the first pipeline action span (F / B / W / BW) on any rank to the last one's end;
a stage's idle fraction is 1 − busy / window, averaged over its ranks and over steps ≥ 1.

Split: `inherent_s` is the idle time the schedule itself imposes (warm-up, cool-down and the
steady-state gaps of the same action order) given the measured per-stage action times: the
jobs.schedules simulator run with the mean measured t_f / t_b_input / t_b_weight of every model
stage and no communication delay. `stall_s = idle_s − inherent_s` is the rest: waiting on a
neighbour (transfer, jitter, a slow peer). Both are also given as fractions of the measured
window, so inherent + stall = measured_idle_fraction. `simulated` is the simulator's own idle
fraction (idle / its makespan) and `closed_form` the textbook (p−1)/(v·m+p−1).
Standard library only.
"""

from __future__ import annotations

from collections import defaultdict

from jobs import bubbles, schedules

from .load import Traces


def _layout(tr: Traces, spec, pred: dict | None) -> tuple[str, int, int, int] | None:
    pipe = pred or {}
    if pipe.get("schedule") and pipe.get("p", 1) > 1:
        return pipe["schedule"], int(pipe["p"]), int(pipe["m"]), int(pipe.get("v") or 1)
    if spec is not None and spec.parallel.pp > 1:
        p = spec.parallel
        return p.pp_schedule, p.pp, p.microbatches, p.virtual_stages
    return None


def stage_times(tr: Traces, p: int, v: int, steps: set[int], placement: str = "loop") -> dict:
    """Mean measured seconds per global model stage of F, input-gradient and weight-gradient
    backward (a full BW counts as input-gradient). Spans without a `stage` are placed by their
    chunk and `placement` (jobs.schedules.placement_of(schedule))."""
    acc: dict[tuple[str, int], list[float]] = defaultdict(list)
    for rank, recs in tr.ranks.items():
        pp = int(tr.coords(rank).get("pp", rank) or 0)
        for r in recs:
            a = r.get("action")
            if r.get("type") != "span" or a not in bubbles.ACTIONS or r.get("step") not in steps:
                continue
            st = r.get("stage")
            if not isinstance(st, int):
                st = schedules.stage_of(pp, int(r.get("chunk") or 0), p, v, placement)
            acc[("B" if a == "BW" else a, st)].append(r["dur_ns"] / 1e9)

    def mean(kind):
        out = []
        for s in range(p * v):
            xs = acc.get((kind, s), [])
            out.append(sum(xs) / len(xs) if xs else 0.0)
        return out
    return {"t_f": mean("F"), "t_b_input": mean("B"), "t_b_weight": mean("W")}


def stage_bubbles_table(tr: Traces, spec, pred: dict | None) -> list[dict]:
    lay = _layout(tr, spec, pred)
    stages = {int(tr.coords(r).get("pp", 0) or 0) for r in tr.ranks}
    if lay is None and len(stages) < 2:
        return []
    measured = bubbles.stage_bubbles(tr.ranks)
    all_steps = sorted(measured["steps"])
    if not all_steps:
        tr.warnings.append("pipeline run without pipeline action spans (F/B/W/BW): no bubble")
        return []
    if lay is None:
        tr.warnings.append("pipeline layout unknown (no spec): measured bubble only")
        lay = (None, max(stages) + 1, None, 1)
    schedule, p, m, v = lay
    use = [s for s in all_steps if s >= 1] or all_steps
    sim = closed = None
    if schedule is not None:
        try:
            sim = schedules.simulate(schedule, p, m, v,
                                     **stage_times(tr, p, v, set(use),
                                                   schedules.placement_of(schedule)))
            closed = schedules.closed_form_bubble(schedule, p, m, v)
        except ValueError as exc:
            tr.warnings.append(f"bubble simulation failed ({exc})")
    rows = []
    for stage in range(p):
        vals = [measured["steps"][s]["stages"].get(stage) for s in use]
        windows = [measured["steps"][s]["window_s"] for s, x in zip(use, vals, strict=True) if x]
        vals = [x for x in vals if x]
        if not vals:
            continue
        window = sum(windows) / len(windows)
        busy = sum(x["busy_s"] for x in vals) / len(vals)
        frac = sum(x["idle_fraction"] for x in vals) / len(vals)
        idle = frac * window
        srank = sim["ranks"][stage] if sim else None
        inherent_s = min(srank["bubble"]["inherent_s"], idle) if srank else None
        rows.append({
            "stage": stage, "ranks": vals[0]["ranks"], "steps": len(vals), "schedule": schedule,
            "p": p, "m": m, "v": v, "window_s": window, "busy_s": busy, "idle_s": idle,
            "measured_idle_fraction": frac, "inherent_s": inherent_s,
            "stall_s": idle - inherent_s if inherent_s is not None else None,
            "inherent": inherent_s / window if inherent_s is not None and window else None,
            "stall": (idle - inherent_s) / window if inherent_s is not None and window else None,
            "simulated": srank["idle_fraction"] if srank else None,
            "closed_form": closed,
            "predicted": (pred or {}).get("bubble_fraction")})
    return rows
