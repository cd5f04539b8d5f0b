"""The analysis document of a run: the table names, the headline (each figure an aggregate of
one table under rules.RULES), the predictions joined to the measured bytes, and strict-JSON
cleaning. The engine (engine.py) assembles its result here, and so does the tests' oracle
(devtools/oracle), so a figure has one definition whoever computed the rows.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict

from jobs import trace_schedule as TS

from . import labels as L
from . import memory as M
from . import moe as MOE
from . import predicted as P
from . import rules
from . import stragglers as SG

SCHEMA = 5  # 2: headline/ranks/bandwidth tables, bubble_s in step_rank, rules; 3: MoE tables;
# 4: bounded tracing (throughput `traced`, untraced steps from `scalars`, run.trace); 5: one
# peak memory (memory `total` rows, buffers included), throughput without unfinished steps
TABLES = ("headline", "step_rank", "ranks", "throughput", "stragglers", "straggler_ranks",
          "collectives",
          "bandwidth", "axis_bytes", "links", "placement", "memory", "stage_bubbles",
          "expert_load", "all_to_all")
ANALYSIS_FILE = "analysis.json"
PERFETTO_FILE = "trace.perfetto.json"
STEP_MEANS = ("compute", "comm", "exposed_comm", "bubble", "idle")


def safe(warnings: list[str], name: str, fn, default):
    """fn(), or `default` with the reason in `warnings`: a partial trace degrades."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - a partial trace degrades, never raises
        warnings.append(f"{name}: not computed ({type(exc).__name__}: {exc})")
        return default


def axis_predictions(rows: list[dict], pred: dict | None, summary: dict | None) -> None:
    """Add predicted_bytes (theory, busiest rank, per step), formula_bytes (seeds' formula on
    the measured Ψ, per rank, data-parallel only) and error_pct to the axis_bytes rows."""
    per_axis = P.axis_bytes_per_step(pred)
    check = (summary or {}).get("formula_check") or {}
    formula = {r.get("rank"): r.get("bytes_sent_formula") for r in check.get("ranks") or []}
    for r in rows:
        p = per_axis.get(r["axis"])
        f = formula.get(r["rank"]) if r["axis"] == "dp" else None
        m = r["bytes_sent_per_step"]
        r["predicted_bytes"] = p
        r["error_pct"] = 100.0 * (m - p) / p if p and m is not None else None
        r["formula_bytes"] = f
        r["deviation_bytes"] = m - f if m is not None and f is not None else None
        r["padding_elems"] = check.get("padding_elems") if f is not None else None


def headline(tables: dict, agg: dict, pred: dict | None, pp: int,
             spec_dict: dict | None = None) -> dict:
    """The run's figures: `agg` (step_aggregates) for the per-step tables, the small tables
    read here (peak memory from the memory table's `total` rows: memory.peak_bytes)."""
    step_time, tokens = agg["step_time_s"], agg["tokens"]
    sent: dict[int, float] = defaultdict(float)
    for r in tables["axis_bytes"]:
        sent[r["rank"]] += r["bytes_sent_per_step"] or 0.0
    strag = agg["straggler"]
    errs = [abs(r["error_pct"]) for r in tables["memory"]
            if r["error_pct"] is not None and r["component"] in M.STATE + ("model_state",)]
    bub = tables["stage_bubbles"] if pp > 1 else []

    def mean(key):
        vals = [r[key] for r in bub if r.get(key) is not None]
        return sum(vals) / len(vals) if vals else None
    return {
        "steady_steps": agg["steady_steps"],
        "step_time_s": step_time,
        "tokens_per_s": tokens / step_time if tokens and step_time else None,
        "throughput_unit": L.rate_unit(spec_dict),
        "peak_memory_bytes": M.peak_bytes(tables["memory"]),
        "bubble_fraction": mean("measured_idle_fraction"),
        "bubble_simulated_fraction": mean("simulated"),
        "bubble_closed_form": mean("closed_form"),
        "overlap_pct": agg["overlap_pct"],
        **{f"{k}_s": agg[f"{k}_s"] for k in STEP_MEANS},
        "comm_bytes_per_rank": max(sent.values(), default=None),
        "straggler_rank": strag["rank"],
        "straggler_flagged_steps": strag["flagged_steps"],
        "straggler_wait_s": strag["caused_wait_median_s"],
        **SG.straggler_cost(strag["rank"], tables["straggler_ranks"]),
        "memory_error_pct": max(errs) if errs else None,
        "predicted_comm_bytes_per_rank": ((pred or {}).get("comm") or {}).get("bytes_per_rank"),
        "predicted_bubble_fraction": (((pred or {}).get("pipeline") or {}).get("bubble_fraction")
                                      if pp > 1 else None),
        "final_loss": agg["final_loss"],
        **MOE.headline(tables["expert_load"]),
        "steps": agg["steps"], "ranks": agg["ranks"],
    }


def finite(obj):
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): finite(v) for k, v in obj.items()}
    if not isinstance(obj, list | tuple | str | int | float | bool | type(None)):
        return str(obj)
    if isinstance(obj, list | tuple):
        return [finite(v) for v in obj]
    return obj


def json_safe(obj):
    """obj itself when it is strict JSON already (the C encoder checks fast), else a copy
    with NaN / inf replaced by None."""
    try:
        json.dumps(obj, allow_nan=False)
        return obj
    except (ValueError, TypeError):
        return finite(obj)


def result(tr, sp, spec_dict, tables: dict, headline_row: dict, trace: dict,
           engine: str = "python", **extra) -> dict:
    """The analysis dict (`tr`: the run's Traces, records or meta only; `engine`: which
    computed the tables, "columnar" (engine.py) or "python" (the tests' oracle))."""
    strategy = (tr.summary or {}).get("strategy") or (sp.strategy if sp is not None else None)
    run = {"world_size": tr.world_size, "ranks": sorted(tr.ranks), "strategy": strategy,
           "engine": sp.parallel.engine if sp is not None else None,
           "coords": {str(r): tr.coords(r) for r in sorted(tr.ranks)},
           "traced_steps": trace.get("traced_steps"),
           # the schedule in the spec's words beside what the trace holds (a run without a
           # spec: its traces only)
           "trace": {**trace, "schedule": TS.describe(sp.trace) if sp is not None else None}}
    tables = {name: [headline_row] if name == "headline" else tables[name] for name in TABLES}
    return json_safe({"schema": SCHEMA, "run": run, "spec": spec_dict,
                      "headline": headline_row, "rules": rules.RULES, "tables": tables,
                      "warnings": list(tr.warnings), "engine": engine, **extra})
