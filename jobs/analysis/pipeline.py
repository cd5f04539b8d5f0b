"""Per pipeline stage: the measured bubble (from the step_rank table), split into what the
schedule itself imposes and stall; and the schedule simulated with the run's own stage times.

Measured (rules.RULES["bubble"]): per (step, rank) `pipeline_idle_s / pipeline_window_s` of the
step_rank table, averaged over the stage's ranks and the steady steps. That is the simulator's
convention (idle / makespan), so it sits next to:
  simulated     jobs.schedules.simulate with the mean measured t_f / t_b_input / t_b_weight of
                every model stage over the steady steps and no communication delay
  closed_form   the textbook (p−1)/(v·m+p−1) for equal stages
Split: `inherent_s` is the idle time the simulated schedule has on that stage (warm-up,
cool-down and the steady-state gaps of the same action order); `stall_s = idle_s − inherent_s`
is the rest: waiting on a neighbour (transfer, jitter, a slow peer). As fractions of the
measured window, inherent + stall = measured_idle_fraction.
`simulation()` is also what the Gantt draws under the measured timeline, so the two agree.
Standard library only.
"""

from __future__ import annotations

from collections import defaultdict

from jobs import schedules

from . import rules
from .steps import ACTIONS
from .storage.load import Traces


def layout(tr: Traces, spec, pred: dict | None) -> tuple[str, int, int, int] | None:
    """(schedule, p, m, v) of a pipeline run, or None."""
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
    spans = []
    for rank, recs in tr.ranks.items():
        for r in recs:
            a = r.get("action")
            if r.get("type") != "span" or a not in ACTIONS or r.get("step") not in steps:
                continue
            spans.append((rank, a, r.get("stage"), r.get("chunk"), r["dur_ns"] / 1e9, 1))
    return stage_means(tr, spans, p, v, placement)


def stage_means(tr: Traces, spans, p: int, v: int, placement: str = "loop") -> dict:
    """stage_times from (rank, action, stage, chunk, seconds, spans) per action span or per
    group of spans alike (the engine sums them in SQL, pipeline_spans.stage_sums)."""
    acc: dict[tuple[str, int], list] = defaultdict(lambda: [0.0, 0])
    for rank, a, st, chunk, secs, n in spans:
        if not isinstance(st, int):
            pp = int(tr.coords(rank).get("pp", rank) or 0)
            st = schedules.stage_of(pp, int(chunk or 0), p, v, placement)
        x = acc[("B" if a == "BW" else a, st)]
        x[0] += secs
        x[1] += n

    def mean(kind):
        out = []
        for s in range(p * v):
            total, n = acc.get((kind, s), (0.0, 0))
            out.append(total / n if n else 0.0)
        return out
    return {"t_f": mean("F"), "t_b_input": mean("B"), "t_b_weight": mean("W")}


def bubble_steps(step_rows: list[dict]) -> list[int]:
    """The steady steps of the rows that have a pipeline window."""
    return rules.steady(r["step"] for r in step_rows if r.get("pipeline_window_s"))


def simulation(tr: Traces, lay: tuple[str, int, int, int] | None, steps: list[int],
               spans=None) -> dict | None:
    """The schedule simulated with the run's mean stage times over `steps` (seconds), or None.
    `spans`: steps -> stage_means' spans (default: tr's action spans, stage_times).
    ValueError from the simulator propagates (caller decides)."""
    if lay is None or lay[0] is None or not steps:
        return None
    schedule, p, m, v = lay
    times = stage_times(tr, p, v, set(steps), schedules.placement_of(schedule)) \
        if spans is None else stage_means(tr, spans(steps), p, v, schedules.placement_of(
            schedule))
    if not any(times["t_f"]):
        return None
    return schedules.simulate(schedule, p, m, v, **times)


def stage_bubbles_table(tr: Traces, spec, pred: dict | None, step_rows: list[dict],
                        spans=None) -> list:
    """Per stage (module doc); `spans`: simulation's (the engine's SQL sums)."""
    lay = layout(tr, spec, pred)
    pipe_rows = [r for r in step_rows if r.get("pipeline_window_s")]
    if not pipe_rows:
        if lay is not None:
            tr.warnings.append("pipeline run without pipeline action spans (F/B/W/BW): "
                               "no bubble")
        return []
    if lay is None:
        tr.warnings.append("pipeline layout unknown (no spec): measured bubble only")
        lay = (None, max(int(r["pp"] or 0) for r in pipe_rows) + 1, None, 1)
    schedule, p, m, v = lay
    use = set(bubble_steps(step_rows))
    sim = closed = None
    if schedule is not None:
        try:
            sim = simulation(tr, lay, sorted(use), spans)
            closed = schedules.closed_form_bubble(schedule, p, m, v)
        except ValueError as exc:
            tr.warnings.append(f"bubble simulation failed ({exc})")
    by_stage: dict[int, list[dict]] = defaultdict(list)
    for r in pipe_rows:
        if r["step"] in use:
            by_stage[int(r["pp"] or 0)].append(r)
    rows = []
    for stage in sorted(by_stage):
        rs = by_stage[stage]
        window = sum(r["pipeline_window_s"] for r in rs) / len(rs)
        frac = sum(r["pipeline_idle_s"] / r["pipeline_window_s"] for r in rs) / len(rs)
        idle = frac * window
        srank = sim["ranks"][stage] if sim and stage < len(sim["ranks"]) else None
        inherent_s = min(srank["bubble"]["inherent_s"], idle) if srank else None
        rows.append({
            "stage": stage, "ranks": sorted({r["rank"] for r in rs}),
            "steps": len({r["step"] for r in rs}), "schedule": schedule, "p": p, "m": m, "v": v,
            "window_s": window, "busy_s": window - idle, "idle_s": idle,
            "measured_idle_fraction": frac, "inherent_s": inherent_s,
            "stall_s": idle - inherent_s if inherent_s is not None else None,
            "inherent": inherent_s / window if inherent_s is not None and window else None,
            "stall": (idle - inherent_s) / window if inherent_s is not None and window else None,
            "simulated": srank["idle_fraction"] if srank else None,
            "closed_form": closed,
            "predicted": (pred or {}).get("bubble_fraction")})
    return rows
