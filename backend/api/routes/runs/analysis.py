"""A run's analysis (every figure of the run page), its downloads, and the Gantt: thin routes
over backend/services/run_analysis.py, which reads the stored analysis, the partial traces of a
running run, or a large run's columnar files (the routes never ask which).

Figures come from one place, `jobs.analysis`; definitions: docs/analysis.md. The Gantt
(backend/services/gantt.py) is the one dashboard-only view: drawing segments, no metric.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query
from fastapi.responses import FileResponse, Response, StreamingResponse

from backend.api.deps import DbDep, RunDep, SettingsDep
from backend.crud.collective_sweeps import latest_sweep
from backend.errors import Invalid
from backend.services import run_files
from backend.services.run_analysis import Download, RunAnalysis
from jobs.analysis import TABLES
from jobs.analysis.history import bandwidth_vs_sweep

router = APIRouter(prefix="/api/runs", tags=["analysis"])

_TABLE_DOC = f"one table: {', '.join(TABLES)}"
_TABLE_ENUM = {"enum": list(TABLES)}  # declared, so a schema-valid table is a served one


def _run_analysis(run: RunDep, settings: SettingsDep) -> RunAnalysis:
    return RunAnalysis(settings.runs_dir, run)


AnalysisDep = Annotated[RunAnalysis, Depends(_run_analysis)]


def _bad_query(field: str, msg: str) -> Invalid:
    return Invalid(msg, field=field, where="query")


def _check_table(table: str | None) -> None:
    if table is not None and table not in TABLES:
        raise _bad_query("table", f"unknown table {table!r} (tables: {', '.join(TABLES)})")


def sweep_join(db, run, analysis: dict) -> dict | None:
    sweep = latest_sweep(db, run.queue, exclude=run.id)
    if sweep is None:
        return None
    rows = bandwidth_vs_sweep((analysis.get("tables") or {}).get("bandwidth") or [],
                              sweep.summary)
    return {"sweep_run_id": sweep.id, "queue": sweep.queue,
            "created_at": sweep.created_at.isoformat() if sweep.created_at else None,
            "rows": rows}


def _send(d: Download) -> Response:
    if d.path is not None:
        return FileResponse(d.path, media_type=d.media, filename=d.name)
    headers = {"Content-Disposition": f'attachment; filename="{d.name}"'}
    if d.streamed:
        return StreamingResponse(d.body, media_type=d.media, headers=headers)
    return Response(d.body, media_type=d.media, headers=headers)


@router.get("/{run_id}/metrics")
def get_metrics(ra: AnalysisDep, db: DbDep,
                table: str | None = Query(None, json_schema_extra=_TABLE_ENUM,
                                          description=_TABLE_DOC),
                offset: int = Query(0, ge=0, le=2**31, description="with table: first row"),
                limit: int | None = Query(None, ge=1, le=2**31,
                                          description="with table: at most rows"),
                ) -> dict:
    """The run's analysis (headline, rules, tables, warnings; `partial` while the run has no
    stored analysis) plus `bandwidth_vs_sweep` (its bandwidth table next to the latest
    bandwidth sweep of the same queue, or null), or one table's rows with `?table=` (paged by
    offset / limit; `total` counts them all)."""
    _check_table(table)
    if table is not None:
        return ra.table_page(table, offset, limit)
    analysis = ra.document()
    return {**analysis, "bandwidth_vs_sweep": sweep_join(db, ra.run, analysis)}


@router.get("/{run_id}/export")
def export_run(ra: AnalysisDep,
               format: Literal["perfetto", "json", "csv", "kineto", "flight",
                               "checkpoint"] = Query(
                   "perfetto", description="perfetto: Chrome-trace JSON of the whole run; json: "
                   "the analysis (or one table); csv: one table; kineto: PyTorch profiler "
                   "traces for HTA / TensorBoard, a .zip of rank{R}.pt.trace.json; flight: the "
                   "flight recorder's dumps in torch's format (fr_trace), a .zip; checkpoint: "
                   "a complete checkpoint's DCP folder, a .zip"),
               table: str | None = Query(None, json_schema_extra=_TABLE_ENUM,
                                         description=_TABLE_DOC + " (required for csv)"),
               t0_ms: float | None = Query(None, ge=0, allow_inf_nan=False,
                                           description="perfetto: window start, ms from the "
                                           "trace start (the Gantt's axis; with t1_ms)"),
               t1_ms: float | None = Query(None, ge=0, allow_inf_nan=False,
                                           description="perfetto: window end (> t0_ms)"),
               rank: int | None = Query(None, ge=0, le=2**31, description="kineto: one "
                                        "rank's document (JSON) instead of the zip"),
               step: int | None = Query(None, ge=0, le=2**31, description="checkpoint: the "
                                        "checkpoint's step (default: the latest complete one)"),
               ) -> Response:
    """Download the Perfetto trace, the analysis as JSON, one table as CSV, or the Kineto
    traces (docs/trace-schema.md "Kineto export"): the same tables, names and values the run
    page shows. The Perfetto document is built on request
    and streamed; a window (`t0_ms`, `t1_ms`) keeps only the records overlapping it, times
    from the run's origin."""
    _check_table(table)
    if step is not None and format != "checkpoint":
        raise _bad_query("step", "a step applies to format=checkpoint only")
    if format in ("flight", "checkpoint"):
        if rank is not None or t0_ms is not None or t1_ms is not None or table is not None:
            field = next(n for n, v in (("rank", rank), ("t0_ms", t0_ms), ("t1_ms", t1_ms),
                                        ("table", table)) if v is not None)
            raise _bad_query(field, f"does not apply to format={format}")
        return _send(run_files.flight(ra) if format == "flight"
                     else run_files.checkpoint(ra, step))
    if rank is not None and format != "kineto":
        raise _bad_query("rank", "a rank applies to format=kineto only")
    if format == "kineto":
        if t0_ms is not None or t1_ms is not None:
            raise _bad_query("t0_ms" if t0_ms is not None else "t1_ms",
                             "a window applies to format=perfetto only")
        return _send(ra.kineto(rank))
    if (t0_ms is None) != (t1_ms is None):
        raise _bad_query("t1_ms" if t1_ms is None else "t0_ms",
                         "give both t0_ms and t1_ms (a window), or neither")
    if t0_ms is not None:
        if format != "perfetto":
            raise _bad_query("t0_ms", "a window applies to format=perfetto only")
        if not t1_ms > t0_ms:
            raise _bad_query("t1_ms", f"must be greater than t0_ms = {t0_ms:g}")
        return _send(ra.perfetto((t0_ms, t1_ms)))
    if format == "perfetto":
        return _send(ra.perfetto())
    if format == "csv" and table is None:
        raise _bad_query("table", "required for format=csv: " + _TABLE_DOC)
    return _send(ra.table_download(format, table))


@router.get("/{run_id}/gantt")
def get_gantt(ra: AnalysisDep,
              step: int | None = Query(None, ge=-1, le=2**31, description="one optimizer step"),
              t0_ms: float | None = Query(None, allow_inf_nan=False,
                                          description="window start, ms from the trace start"),
              t1_ms: float | None = Query(None, allow_inf_nan=False,
                                          description="window end, ms from the trace start"),
              max_spans: int = Query(20000, ge=100, le=100000,
                                     description="bound on the segments returned (level of "
                                                 "detail)"),
              px: int = Query(2000, ge=100, le=10000, description="drawing width in pixels"),
              ) -> dict:
    """Per-rank Gantt segments of a window. When the window holds more than `max_spans` spans,
    spans closer than a bucket width are merged (`n` > 1), so the answer stays bounded. A
    converted (finished) run reads only the window's records (backend/services/
    gantt_columnar.py; without a step or window it opens on the whole run when that fits one
    answer, else on its middle step)."""
    return ra.gantt(step=step, t0_ms=t0_ms, t1_ms=t1_ms, max_spans=max_spans, px=px)


@router.get("/{run_id}/gantt/steps")
def gantt_steps(ra: AnalysisDep) -> dict:
    """The trace's optimizer steps and their windows (ms from the trace start), for the step
    selector, without any span."""
    return ra.gantt_steps()
