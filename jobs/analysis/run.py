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
    """Analyze `out_dir`, write `analysis.json` there, return the headline (no Perfetto
    file: the export builds it on request from the traces, perfetto.py). Never raises
    (failures land in the analysis' warnings or the returned headline's `analysis_error`).
    A converted run, whatever its size, takes the columnar engine (scale.py): its large
    tables go to `table-<name>.parquet`; a folder of JSON lines only, or a run that engine
    does not cover (scale.applies), the Python path. `live`: the worker's analyze_live.
    LiveAnalysis of the run, which the columnar engine goes on from (else it is discarded)."""
    out_dir = Path(out_dir)
    columnar.use_system_pool()
    why: list[str] = []  # why a converted run took the Python path
    try:
        try:
            result = _scale_result(out_dir, spec, live, why)
        finally:  # what the columnar engine did not go on from (a Python-path run) is removed
            if live is not None:
                live.discard("the columnar engine did not go on from it")
        if result is None:
            _python_fits(out_dir)
            result = analyze(load_run_dir(out_dir), spec)
            result["warnings"] = why + result["warnings"]
        _write_json(out_dir / ANALYSIS_FILE, result)
        return result["headline"]
    except Exception as exc:  # noqa: BLE001 - the worker must finish the run regardless
        return {"analysis_error": f"{type(exc).__name__}: {exc}"}


def _python_fits(out_dir: Path) -> None:
    """ValueError when a converted run is too large for the Python path (scale.
    PYTHON_MAX_RECORDS): the columnar path did not take it, so loading it whole would only
    end with the worker killed for memory."""
    from . import scale
    if not columnar.has_columnar(out_dir):
        return
    try:
        n = scale.record_count(out_dir)
    except Exception:  # noqa: BLE001 - a damaged file: its JSON lines say how large it is
        return
    if n > scale.PYTHON_MAX_RECORDS:
        raise ValueError(
            f"{n:,} trace records: more than the Python analysis loads "
            f"({scale.PYTHON_MAX_RECORDS:,}), and the columnar engine does not cover this run "
            "(a field its tables read kept in args, of another type than its column); trace "
            "fewer steps (spec trace: a schedule or steps) to analyse it")


def _scale_result(out_dir: Path, spec, live, why: list[str]) -> dict | None:
    """The columnar engine's analysis of a converted run (scale.use) it covers (scale.
    applies), else None, with the reason in `why` for a converted run: the Python path then
    answers from the JSON lines, and its warnings say why. A failure of the engine itself
    is one (the run's figures still come, the warning names the error). A stale whole-run
    Perfetto file of an earlier analysis is removed (it would disagree)."""
    from . import scale
    if not scale.use(out_dir):
        return None
    try:
        con = V.connect(out_dir, scale.MEMORY_LIMIT)
        covered = scale.applies(con)
    except Exception as exc:  # noqa: BLE001 - unreadable files: the JSON lines still are
        why.append(f"the run's Parquet files could not be read ({type(exc).__name__}: "
                   f"{exc}): the Python path analysed its JSON lines")
        return None
    if not covered:
        why.append("the columnar engine does not cover this run (a field its tables read is "
                   "kept in args): the Python path analysed its JSON lines")
        return None
    try:
        result = scale.analyze_columnar(out_dir, spec, con, live)
    except Exception as exc:  # noqa: BLE001 - the figures still come, the warning says why
        why.append(f"the columnar engine failed ({type(exc).__name__}: {exc}): the Python "
                   "path analysed the run's JSON lines")
        return None
    (out_dir / PERFETTO_FILE).unlink(missing_ok=True)
    return result
