"""A finished (or partial) run's analysis: tables, headline, files. write_analysis hands a
converted run to the columnar engine (scale.py); `analyze` is the Python path over loaded
traces (standard library): a running run's partial figures, JSON lines only.

`analyze_run_dir` never raises on a partial trace: each table is computed on its own, and a
table that cannot be computed is left empty with the reason in `warnings`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from . import assemble as A
from . import collectives as C
from . import columnar
from . import links as LK
from . import memory as M
from . import moe as MOE
from . import pipeline as PL
from . import predicted as P
from . import steps as S
from . import stragglers as SG
from . import vec_tables as V
from .assemble import ANALYSIS_FILE, PERFETTO_FILE, SCHEMA, TABLES  # noqa: F401 - re-exported
from .load import Traces, load_run_dir


def _safe(tr: Traces, name: str, fn, default):
    return A.safe(tr.warnings, name, fn, default)


def analyze(tr: Traces, spec=None) -> dict:
    """Tables + headline of loaded traces (see analyze_run_dir): the Python path."""
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
    t["links"] = _safe(tr, "links", lambda: LK.links_table(tr, sp, t["collectives"], pred), [])
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
    headline = _safe(tr, "headline", lambda: A.headline(t, A.step_aggregates(
        t["step_rank"], t["throughput"], t["stragglers"]), pred, pp, spec_dict), {})
    return A.result(tr, sp, spec_dict, t, headline, trace)


def analyze_run_dir(out_dir: Path, spec=None) -> dict:
    """{"schema", "run", "spec", "headline", "tables": {name: [rows]}, "warnings"} of a run
    folder (`trace-rank*.jsonl`, `summary.json` if present) by the Python path, whatever else
    the folder holds. `spec`: a JobSpec or spec dict; default the one in the traces' meta
    record."""
    return analyze(load_run_dir(Path(out_dir)), spec)


def _write_json(path: Path, obj) -> None:
    tmp = path.with_name(path.name + ".part")
    try:
        text = json.dumps(obj, separators=(",", ":"), allow_nan=False)
    except ValueError:
        text = json.dumps(A.finite(obj), separators=(",", ":"), allow_nan=False)
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def write_analysis(out_dir: Path, spec=None, live=None) -> dict:
    """Analyze `out_dir` by the columnar engine (analyze_folder), write `analysis.json`
    there, return the headline (no Perfetto file: the export builds it on request from the
    Parquet traces, perfetto.py). Never raises (a failure lands in the analysis' warnings or
    the returned headline's `analysis_error`). `live`: the worker's analyze_live.LiveAnalysis
    of the run, which the engine goes on from (else it is discarded)."""
    out_dir = Path(out_dir)
    try:
        try:
            result = analyze_folder(out_dir, spec, live)
        finally:  # what the engine did not go on from is removed
            if live is not None:
                live.discard("the columnar engine did not go on from it")
        _write_json(out_dir / ANALYSIS_FILE, result)
        return result["headline"]
    except Exception as exc:  # noqa: BLE001 - the worker must finish the run regardless
        return {"analysis_error": f"{type(exc).__name__}: {exc}"}


def analyze_folder(out_dir: Path, spec=None, live=None) -> dict:
    """The analysis of a run folder, whatever its size or layout, by the one engine (scale.
    analyze_columnar over the run's Parquet files): a folder of JSON lines only is converted
    first (convert.py, beside its lines); Parquet files that cannot be read are converted
    again from the lines, and the analysis' first warning says so. A stale Perfetto file of
    an earlier analysis is removed (it would disagree)."""
    from . import convert, scale
    out_dir = Path(out_dir)
    columnar.use_system_pool()
    notes: list[str] = []
    if not columnar.has_columnar(out_dir):
        convert.convert_run_dir(out_dir)
    try:
        con = V.connect(out_dir, scale.MEMORY_LIMIT)
        hidden = scale.hidden_fields(con)
    except Exception as exc:  # noqa: BLE001 - damaged files: the JSON lines still are
        if not any(out_dir.glob("trace-rank*.jsonl")):
            raise
        notes.append(f"the run's Parquet files could not be read ({type(exc).__name__}: "
                     f"{exc}): converted again from its JSON lines")
        for p in out_dir.glob("trace-rank*" + columnar.SUFFIX):
            p.unlink()
        convert.convert_run_dir(out_dir)
        con = V.connect(out_dir, scale.MEMORY_LIMIT)
        hidden = scale.hidden_fields(con)
    if hidden:
        notes.append("records keep " + ", ".join(f"{t} {f}" for t, f in hidden) + " in args "
                     "(a value of another type than the trace schema's): the tables read "
                     "those records without it")
    result = scale.analyze_columnar(out_dir, spec, con, live)
    result["warnings"] = notes + result["warnings"]
    (out_dir / PERFETTO_FILE).unlink(missing_ok=True)
    return result
