"""A finished (or partial) run's analysis: tables, headline, files. Standard library, plus
DuckDB for the vectorised tables of a run whose traces were converted to Parquet (issue 19).

`analyze_run_dir` never raises on a partial trace: each table is computed on its own, and a
table that cannot be computed is left empty with the reason in `warnings`.
"""

from __future__ import annotations

import json
import math
import os
from collections import defaultdict
from pathlib import Path

from . import collectives as C
from . import columnar, rules
from . import links as LK
from . import memory as M
from . import moe as MOE
from . import pipeline as PL
from . import predicted as P
from . import steps as S
from . import stragglers as SG
from . import vec_steps as VS
from . import vec_tables as V
from .export import write_perfetto
from .load import Traces, load_run_dir

SCHEMA = 4  # 2: headline/ranks/bandwidth tables, bubble_s in step_rank, rules; 3: MoE tables;
# 4: bounded tracing (throughput `traced`, untraced steps from `scalars`, run.trace)
TABLES = ("headline", "step_rank", "ranks", "throughput", "stragglers", "straggler_ranks",
          "collectives",
          "bandwidth", "axis_bytes", "links", "placement", "memory", "stage_bubbles",
          "expert_load", "all_to_all")
ANALYSIS_FILE = "analysis.json"
PERFETTO_FILE = "trace.perfetto.json"


def _safe(tr: Traces, name: str, fn, default):
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - a partial trace degrades, never raises
        tr.warnings.append(f"{name}: not computed ({type(exc).__name__}: {exc})")
        return default


def _axis_predictions(rows: list[dict], pred: dict | None, summary: dict | None) -> None:
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


def _headline(tables: dict, pred: dict | None, pp: int, peak: int | None) -> dict:
    """The run's figures, each an aggregate of one table under rules.RULES."""
    sr = tables["step_rank"]
    steady = set(rules.steady(r["step"] for r in sr))
    use = [r for r in sr if r["step"] in steady]
    comm = sum(r["comm_s"] for r in use)
    thr = tables["throughput"]
    step_time = rules.median_steady({r["step"]: r["step_s"] for r in thr})
    tokens = next((r["tokens"] for r in thr if r.get("tokens")), None)
    sent: dict[int, float] = defaultdict(float)
    for r in tables["axis_bytes"]:
        sent[r["rank"]] += r["bytes_sent_per_step"] or 0.0
    strag = SG.straggler_of_run(tables["stragglers"])
    errs = [abs(r["error_pct"]) for r in tables["memory"]
            if r["error_pct"] is not None and r["component"] in M.STATE + ("model_state",)]
    bub = tables["stage_bubbles"] if pp > 1 else []

    def mean(key):
        vals = [r[key] for r in bub if r.get(key) is not None]
        return sum(vals) / len(vals) if vals else None
    return {
        "steady_steps": rules.steady_range(r["step"] for r in thr if r["step_s"] is not None),
        "step_time_s": step_time,
        "tokens_per_s": tokens / step_time if tokens and step_time else None,
        "peak_memory_bytes": peak,
        "bubble_fraction": mean("measured_idle_fraction"),
        "bubble_simulated_fraction": mean("simulated"),
        "bubble_closed_form": mean("closed_form"),
        "overlap_pct": 100.0 * sum(r["overlap_s"] for r in use) / comm if comm else None,
        **{f"{k}_s": _mean_of(use, f"{k}_s") for k in ("compute", "comm", "exposed_comm",
                                                        "bubble", "idle")},
        "comm_bytes_per_rank": max(sent.values(), default=None),
        "straggler_rank": strag["rank"],
        "straggler_flagged_steps": strag["flagged_steps"],
        "straggler_wait_s": strag["caused_wait_median_s"],
        **SG.straggler_cost(strag["rank"], tables["straggler_ranks"]),
        "memory_error_pct": max(errs) if errs else None,
        "predicted_comm_bytes_per_rank": ((pred or {}).get("comm") or {}).get("bytes_per_rank"),
        "predicted_bubble_fraction": (((pred or {}).get("pipeline") or {}).get("bubble_fraction")
                                      if pp > 1 else None),
        "final_loss": next((r["loss"] for r in reversed(thr) if r.get("loss") is not None),
                           None),
        **MOE.headline(tables["expert_load"]),
        "steps": len(thr), "ranks": len({r["rank"] for r in sr}),
    }


def _mean_of(rows: list[dict], key: str) -> float | None:
    """Mean per (step, rank) row of a step_rank column (None when no row has it)."""
    vals = [r[key] for r in rows if r.get(key) is not None]
    return sum(vals) / len(vals) if vals else None


def _finite(obj):
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): _finite(v) for k, v in obj.items()}
    if not isinstance(obj, list | tuple | str | int | float | bool | type(None)):
        return str(obj)
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


def _json_safe(obj):
    """obj itself when it is strict JSON already (the C encoder checks fast), else a copy
    with NaN / inf replaced by None."""
    try:
        json.dumps(obj, allow_nan=False)
        return obj
    except (ValueError, TypeError):
        return _finite(obj)


def vector_source(out_dir: Path, warnings: list[str] | None = None):
    """A DuckDB connection over the run's Parquet files (vec_tables.connect) when the worker
    converted its traces (columnar.py), else None: the tables then come from the Python
    loops only (also when DuckDB cannot open them: the reason goes to `warnings`)."""
    if not columnar.has_columnar(out_dir):
        return None
    try:
        return V.connect(out_dir)
    except Exception as exc:  # noqa: BLE001 - the Python path still answers
        if warnings is not None:
            warnings.append(f"vectorised analysis unavailable ({type(exc).__name__}: {exc})")
        return None


def _vec_or(vec, fn, warnings: list[str]):
    """The vectorised table where it applies (fn returns None where it does not); None too
    when it fails, so the caller's Python function answers instead."""
    if vec is None:
        return None
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001
        warnings.append(f"vectorised table failed, Python path used ({type(exc).__name__}: "
                        f"{exc})")
        return None


def analyze(tr: Traces, spec=None, vec=None) -> dict:
    """Tables + headline of loaded traces (see analyze_run_dir). `vec`: vector_source of the
    run folder; the tables vec_tables computes come from DuckDB then (the same rows)."""
    sp = P.spec_of(spec if spec is not None else tr.spec_dict(), tr.warnings)
    spec_dict = sp.to_dict() if sp is not None else tr.spec_dict()
    pred = _safe(tr, "theory", lambda: P.theory(sp, tr.warnings), None)
    t: dict = {}
    t["step_rank"] = _safe(tr, "step_rank", lambda: _vec_or(
        vec, lambda: VS.step_rank_table(vec, tr), tr.warnings) or S.step_rank_table(tr), [])
    t["collectives"] = _safe(tr, "collectives", lambda: _vec_or(
        vec, lambda: V.collectives_table(vec, tr), tr.warnings) or C.collectives_table(tr), [])
    t["ranks"] = _safe(tr, "ranks", lambda: S.ranks_table(t["step_rank"]), [])
    t["stragglers"] = _safe(tr, "stragglers",
                            lambda: SG.stragglers_table(t["collectives"], t["step_rank"]), [])
    t["straggler_ranks"] = _safe(tr, "straggler_ranks", lambda: SG.straggler_ranks_table(
        t["collectives"], t["step_rank"]), [])
    t["bandwidth"] = _safe(tr, "bandwidth", lambda: C.bandwidth_table(t["collectives"]), [])
    t["axis_bytes"] = _safe(tr, "axis_bytes", lambda: _vec_or(
        vec, lambda: V.axis_bytes_table(vec, tr), tr.warnings) or C.axis_bytes_table(tr), [])
    _safe(tr, "axis_bytes predictions",
          lambda: _axis_predictions(t["axis_bytes"], pred, tr.summary), None)
    t["links"] = _safe(tr, "links", lambda: LK.links_table(tr, sp, t["collectives"], pred), [])
    t["placement"] = _safe(tr, "placement", lambda: LK.placement_table(tr, sp), [])
    t["memory"] = _safe(tr, "memory", lambda: M.memory_table(tr, sp, pred), [])
    t["stage_bubbles"] = _safe(tr, "stage_bubbles", lambda: PL.stage_bubbles_table(
        tr, sp, P.pipeline(pred), t["step_rank"]), [])
    t["expert_load"] = _safe(tr, "expert_load", lambda: MOE.expert_load_table(tr), [])
    t["all_to_all"] = _safe(tr, "all_to_all", lambda: MOE.all_to_all_table(tr), [])
    scalars = _safe(tr, "scalars", lambda: S.scalar_rows(tr), [])
    t["throughput"] = _safe(tr, "throughput", lambda: S.throughput_table(
        t["step_rank"], spec_dict, tr.summary, scalars), [])
    trace = _safe(tr, "trace coverage", lambda: S.trace_coverage(tr, t["step_rank"], scalars),
                  {})
    vpeak = _safe(tr, "peak memory", lambda: _vec_or(vec, lambda: V.peak_bytes(vec),
                                                              tr.warnings), None)
    peak = vpeak[0] if vpeak and vpeak[1] else _safe(tr, "peak memory",
                                                     lambda: M.peak_bytes(tr), None)
    pp = sp.parallel.pp if sp is not None else max(
        [tr.coords(r).get("pp", 0) for r in tr.ranks] or [0]) + 1
    headline = _safe(tr, "headline", lambda: _headline(t, pred, pp, peak), {})
    t["headline"] = [headline]
    strategy = (tr.summary or {}).get("strategy") or (sp.strategy if sp is not None else None)
    run = {"world_size": tr.world_size, "ranks": sorted(tr.ranks), "strategy": strategy,
           "engine": sp.parallel.engine if sp is not None else None,
           "coords": {str(r): tr.coords(r) for r in sorted(tr.ranks)},
           "traced_steps": trace.get("traced_steps"), "trace": trace}
    tables = {name: t[name] for name in TABLES}
    return _json_safe({"schema": SCHEMA, "run": run, "spec": spec_dict, "headline": headline,
                       "rules": rules.RULES, "tables": tables, "warnings": list(tr.warnings)})


def analyze_run_dir(out_dir: Path, spec=None) -> dict:
    """{"schema", "run", "spec", "headline", "tables": {name: [rows]}, "warnings"} of a run
    folder (`trace-rank*.jsonl`, `summary.json` if present). `spec`: a JobSpec or spec dict; default
    the one in the traces' meta record."""
    tr = load_run_dir(Path(out_dir))
    return analyze(tr, spec, vector_source(Path(out_dir), tr.warnings))


def _write_json(path: Path, obj) -> None:
    tmp = path.with_name(path.name + ".part")
    try:
        text = json.dumps(obj, separators=(",", ":"), allow_nan=False)
    except ValueError:
        text = json.dumps(_finite(obj), separators=(",", ":"), allow_nan=False)
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def write_analysis(out_dir: Path, spec=None) -> dict:
    """Analyze `out_dir`, write `analysis.json` and `trace.perfetto.json` there, return the
    headline. Never raises (failures land in the analysis' warnings or the returned
    headline's `analysis_error`)."""
    out_dir = Path(out_dir)
    try:
        tr = load_run_dir(out_dir)
        result = analyze(tr, spec, vector_source(out_dir, tr.warnings))
        try:
            write_perfetto(out_dir / PERFETTO_FILE, tr, result["spec"])
        except Exception as exc:  # noqa: BLE001
            result["warnings"].append(f"perfetto export failed ({type(exc).__name__}: {exc})")
        _write_json(out_dir / ANALYSIS_FILE, result)
        return result["headline"]
    except Exception as exc:  # noqa: BLE001 - the worker must finish the run regardless
        return {"analysis_error": f"{type(exc).__name__}: {exc}"}
