"""The analysis oracle: every table of a run computed from its loaded records in the standard
library, record by record, independently of the product's columnar engine (jobs/analysis/
engine.py and the np_* / scale_* modules it drives). The tests compare the engine's analyses
with this one (tests/analysis/test_engine.py and the others), and the benchmarks measure the
engine against it (the "JSON path"). Not product code: nothing under jobs/, backend/ or worker/
imports it (tests/test_import_arrows.py).

What it shares with the engine is what defines a figure, not what computes it: the rules
(steady steps, thresholds: jobs/analysis/rules.py), the per-record predicates (a blocking
collective, a pipeline action: jobs/analysis/steps.py), the instance's group key
(jobs/analysis/collectives.py), the small tables both build from the same few records
(memory, placement, MoE, stage bubbles) and the assembly of the document (assemble.py).

    analyze(traces, spec=None)          -> the analysis document of loaded traces
    analyze_run_dir(out_dir, spec=None) -> the same of a run folder (load.load_run_dir)
"""

from __future__ import annotations

from pathlib import Path

from devtools.oracle import collectives as C
from devtools.oracle import links as OL
from devtools.oracle import steps as S
from devtools.oracle import stragglers as SG
from jobs.analysis import assemble as A
from jobs.analysis import links as LK
from jobs.analysis import memory as M
from jobs.analysis import moe as MOE
from jobs.analysis import pipeline as PL
from jobs.analysis import predicted as P
from jobs.analysis import rules
from jobs.analysis import stragglers as JSG
from jobs.analysis.assemble import STEP_MEANS
from jobs.analysis.storage.load import Traces, load_run_dir


def _safe(tr: Traces, name: str, fn, default):
    return A.safe(tr.warnings, name, fn, default)


def analyze(tr: Traces, spec=None) -> dict:
    """Tables + headline of loaded traces (see analyze_run_dir)."""
    sp = P.spec_of(spec if spec is not None else tr.spec_dict(), tr.warnings)
    spec_dict = sp.to_dict() if sp is not None else tr.spec_dict()
    pred = _safe(tr, "theory", lambda: P.theory(sp, tr.warnings), None)
    t: dict = {}
    t["step_rank"] = _safe(tr, "step_rank", lambda: S.step_rank_table(tr), [])
    t["collectives"] = _safe(tr, "collectives", lambda: C.collectives_table(tr), [])
    t["ranks"] = _safe(tr, "ranks", lambda: S.ranks_table(t["step_rank"]), [])
    t["stragglers"] = _safe(tr, "stragglers",
                            lambda: SG.stragglers_table(t["collectives"], t["step_rank"]), [])
    t["straggler_ranks"] = _safe(tr, "straggler_ranks", lambda: SG.straggler_ranks_table(
        t["collectives"], t["step_rank"]), [])
    t["bandwidth"] = _safe(tr, "bandwidth", lambda: C.bandwidth_table(t["collectives"]), [])
    t["axis_bytes"] = _safe(tr, "axis_bytes", lambda: C.axis_bytes_table(tr), [])
    _safe(tr, "axis_bytes predictions",
          lambda: A.axis_predictions(t["axis_bytes"], pred, tr.summary), None)
    t["links"] = _safe(tr, "links", lambda: OL.links_table(tr, sp, t["collectives"], pred), [])
    t["placement"] = _safe(tr, "placement", lambda: LK.placement_table(tr, sp), [])
    t["memory"] = _safe(tr, "memory", lambda: M.memory_table(tr, sp, pred), [])
    t["stage_bubbles"] = _safe(tr, "stage_bubbles", lambda: PL.stage_bubbles_table(
        tr, sp, P.pipeline(pred), t["step_rank"]), [])
    t["expert_load"] = _safe(tr, "expert_load", lambda: MOE.expert_load_table(tr), [])
    t["all_to_all"] = _safe(tr, "all_to_all", lambda: MOE.all_to_all_table(tr), [])
    scalars = _safe(tr, "scalars", lambda: S.scalar_rows(tr), [])
    t["throughput"] = _safe(tr, "throughput", lambda: S.throughput_table(
        t["step_rank"], spec_dict, tr.summary, scalars, tr.warnings), [])
    trace = _safe(tr, "trace coverage", lambda: S.trace_coverage(tr, t["step_rank"], scalars),
                  {})
    pp = sp.parallel.pp if sp is not None else max(
        [tr.coords(r).get("pp", 0) for r in tr.ranks] or [0]) + 1
    headline = _safe(tr, "headline", lambda: A.headline(t, step_aggregates(
        t["step_rank"], t["throughput"], t["stragglers"]), pred, pp, spec_dict), {})
    return A.result(tr, sp, spec_dict, t, headline, trace)


def analyze_run_dir(out_dir: Path, spec=None) -> dict:
    """{"schema", "run", "spec", "headline", "tables": {name: [rows]}, "warnings"} of a run
    folder (its Parquet files where they are up to date, else its JSON lines; `summary.json` if
    present), whatever else the folder holds. `spec`: a JobSpec or spec dict; default the one
    in the traces' meta record. Never raises on a partial trace: each table is computed on
    its own, one that cannot be is left empty with the reason in `warnings`."""
    return analyze(load_run_dir(Path(out_dir)), spec)


def mean_of(rows: list[dict], key: str) -> float | None:
    """Mean per (step, rank) row of a step_rank column (None when no row has it)."""
    vals = [r[key] for r in rows if r.get(key) is not None]
    return sum(vals) / len(vals) if vals else None


def step_aggregates(step_rank: list[dict], throughput: list[dict],
                    stragglers: list[dict]) -> dict:
    """The headline's figures over the per-step tables (rows in Python). The engine computes
    the same keys over the tables' Parquet files (engine.step_aggregates; test_engine: equal)."""
    steady = set(rules.steady(r["step"] for r in step_rank))
    use = [r for r in step_rank if r["step"] in steady]
    comm = sum(r["comm_s"] for r in use)
    return {
        "steady_steps": rules.steady_range(r["step"] for r in throughput
                                           if r["step_s"] is not None),
        "step_time_s": rules.median_steady({r["step"]: r["step_s"] for r in throughput}),
        "tokens": next((r["tokens"] for r in throughput if r.get("tokens")), None),
        "overlap_pct": 100.0 * sum(r["overlap_s"] for r in use) / comm if comm else None,
        **{f"{k}_s": mean_of(use, f"{k}_s") for k in STEP_MEANS},
        "final_loss": next((r["loss"] for r in reversed(throughput)
                            if r.get("loss") is not None), None),
        "steps": len(throughput), "ranks": len({r["rank"] for r in step_rank}),
        "straggler": JSG.straggler_of_run(stragglers)}
