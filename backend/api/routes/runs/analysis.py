"""A run's analysis (every figure of the run page), its downloads, and the Gantt.

Figures come from one place, `jobs.analysis`: the stored `analysis.json` the worker wrote when
the run ended, or the same analysis of the partial traces while it runs
(backend/run_traces.py). Definitions: docs/analysis.md. The Gantt (backend/gantt.py) is the
one dashboard-only view: drawing segments, no metric.
"""

from __future__ import annotations

import json
from typing import Literal

from fastapi import APIRouter, Query
from fastapi.responses import FileResponse, Response, StreamingResponse

from backend import gantt, gantt_columnar, run_traces
from backend.api.deps import DbDep, RunDep, SettingsDep
from backend.crud.collective_sweeps import latest_sweep
from backend.errors import Invalid, NotFound
from backend.storage import resolve_run_path
from jobs.analysis import PERFETTO_FILE, TABLES, scale, tables_to_csv
from jobs.analysis.export import iter_csv, iter_json_rows, iter_perfetto_json
from jobs.analysis.history import bandwidth_vs_sweep
from jobs.analysis.labels import csv_header

router = APIRouter(prefix="/api/runs", tags=["analysis"])

_TABLE_DOC = f"one table: {', '.join(TABLES)}"
_TABLE_ENUM = {"enum": list(TABLES)}  # declared, so a schema-valid table is a served one


def _bad_query(field: str, msg: str) -> Invalid:
    return Invalid(msg, field=field, where="query")


def _check_table(table: str | None) -> None:
    if table is not None and table not in TABLES:
        raise _bad_query("table", f"unknown table {table!r} (tables: {', '.join(TABLES)})")


def load_analysis(settings, run) -> dict:
    a = run_traces.analysis(settings.runs_dir / run.id, run.spec)
    if a is None:
        raise NotFound(f"run {run.id} has no analysis yet (status {run.status}): no "
                                 "trace has been written")
    return a


def sweep_join(db, run, analysis: dict) -> dict | None:
    sweep = latest_sweep(db, run.queue, exclude=run.id)
    if sweep is None:
        return None
    rows = bandwidth_vs_sweep((analysis.get("tables") or {}).get("bandwidth") or [],
                              sweep.summary)
    return {"sweep_run_id": sweep.id, "queue": sweep.queue,
            "created_at": sweep.created_at.isoformat() if sweep.created_at else None,
            "rows": rows}


@router.get("/{run_id}/metrics")
def get_metrics(run: RunDep, settings: SettingsDep, db: DbDep,
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
    analysis = load_analysis(settings, run)
    if table is None:
        return {**analysis, "bandwidth_vs_sweep": sweep_join(db, run, analysis)}
    if table in (analysis.get("table_files") or {}):  # a large table: paged from its file
        total, rows = scale.table_rows(settings.runs_dir / run.id, table, offset, limit)
        return {"run_id": run.id, "table": table, "total": total, "offset": offset,
                "rows": rows}
    rows = (analysis.get("tables") or {}).get(table, [])
    end = None if limit is None else offset + limit
    return {"run_id": run.id, "table": table, "total": len(rows), "offset": offset,
            "rows": rows[offset:end]}


@router.get("/{run_id}/export")
def export_run(run: RunDep, settings: SettingsDep,
               format: Literal["perfetto", "json", "csv"] = Query(
                   "perfetto", description="perfetto: Chrome-trace JSON of the whole run; json: "
                   "the analysis (or one table); csv: one table"),
               table: str | None = Query(None, json_schema_extra=_TABLE_ENUM,
                                         description=_TABLE_DOC + " (required for csv)"),
               t0_ms: float | None = Query(None, ge=0, allow_inf_nan=False,
                                           description="perfetto: window start, ms from the "
                                           "trace start (the Gantt's axis; with t1_ms)"),
               t1_ms: float | None = Query(None, ge=0, allow_inf_nan=False,
                                           description="perfetto: window end (> t0_ms)"),
               ) -> Response:
    """Download the Perfetto trace, the analysis as JSON, or one table as CSV: the same
    tables, names and values the run page shows. A Perfetto window (`t0_ms`, `t1_ms`: a run
    too large for the UI) is built from the traces and streamed, only the records
    overlapping it, times from the run's origin."""
    _check_table(table)
    if (t0_ms is None) != (t1_ms is None):
        raise _bad_query("t1_ms" if t1_ms is None else "t0_ms",
                         "give both t0_ms and t1_ms (a window), or neither")
    if t0_ms is not None:
        if format != "perfetto":
            raise _bad_query("t0_ms", "a window applies to format=perfetto only")
        if not t1_ms > t0_ms:
            raise _bad_query("t1_ms", f"must be greater than t0_ms = {t0_ms:g}")
        name = f"paralab-{run.id}-{t0_ms:g}-{t1_ms:g}ms.perfetto.json"
        run_dir = settings.runs_dir / run.id
        if gantt_columnar.is_large(run_dir):  # only the window's records, from Parquet
            try:
                tr, origin = gantt_columnar.export_window(run_dir, t0_ms, t1_ms)
            except ValueError as exc:
                raise _bad_query("t1_ms", str(exc)) from None
            return StreamingResponse(
                iter_perfetto_json(tr, run.spec, window_ms=(t0_ms, t1_ms), origin=origin),
                media_type="application/json",
                headers={"Content-Disposition": f'attachment; filename="{name}"'})
        rt = run_traces.get(run_dir)
        if rt is None:
            raise NotFound(f"run {run.id} has no trace files (yet)")
        return StreamingResponse(
            iter_perfetto_json(rt.traces, run.spec, window_ms=(t0_ms, t1_ms)),
            media_type="application/json",
            headers={"Content-Disposition": f'attachment; filename="{name}"'})
    if format == "perfetto":
        path = resolve_run_path(settings.runs_dir, run.id, PERFETTO_FILE)
        if not path.is_file() and gantt_columnar.is_large(settings.runs_dir / run.id):
            raise _bad_query("t0_ms", "this run is too large for one Perfetto file (columnar "
                             "scale path): export a window with t0_ms and t1_ms (ms from the "
                             "trace start, the Gantt's axis)")
        if not path.is_file():
            raise NotFound(f"run {run.id} has no Perfetto trace yet (status "
                                     f"{run.status}): the worker writes it when the job ends")
        return FileResponse(path, media_type="application/json",
                            filename=f"paralab-{run.id}.perfetto.json")
    if format == "csv" and table is None:
        raise _bad_query("table", "required for format=csv: " + _TABLE_DOC)
    analysis = load_analysis(settings, run)
    tables = dict(analysis.get("tables") or {})
    unit = (analysis.get("headline") or {}).get("throughput_unit")  # the CSV headers' labels
    if table in (analysis.get("table_files") or {}):  # whole, not analysis.json's sample:
        run_dir = settings.runs_dir / run.id  # streamed a row group at a time
        batches = scale.iter_table_rows(run_dir, table)
        if format == "csv":
            cols = scale.table_header(run_dir, table)
            body, media, ext = iter_csv(batches, cols, csv_header(table, cols, unit)), \
                "text/csv", "csv"
        else:
            body, media, ext = iter_json_rows(batches), "application/json", "json"
        return StreamingResponse(body, media_type=media, headers={
            "Content-Disposition": f'attachment; filename="paralab-{run.id}-{table}.{ext}"'})
    if format == "csv":
        body, media, name = tables_to_csv({table: tables.get(table, [])}, table, unit), \
            "text/csv", f"paralab-{run.id}-{table}.csv"
    elif table is not None:
        body, media, name = json.dumps(tables.get(table, [])), "application/json", \
            f"paralab-{run.id}-{table}.json"
    else:
        body, media, name = json.dumps(analysis), "application/json", \
            f"paralab-{run.id}-analysis.json"
    return Response(body, media_type=media,
                    headers={"Content-Disposition": f'attachment; filename="{name}"'})


def _gantt_trace(settings, run) -> gantt.Trace:
    rt = run_traces.get(settings.runs_dir / run.id)
    if rt is None:
        raise NotFound(f"run {run.id} has no trace files (yet)")
    return run_traces.derived(rt, "gantt", gantt.columns)


@router.get("/{run_id}/gantt")
def get_gantt(run: RunDep, settings: SettingsDep,
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
    large converted run reads only the window's records (backend/gantt_columnar.py; without
    a step or window it opens on its middle step)."""
    run_dir = settings.runs_dir / run.id
    if gantt_columnar.is_large(run_dir):
        return gantt_columnar.answer(run_dir, step=step, t0_ms=t0_ms, t1_ms=t1_ms,
                                     max_spans=max_spans, px=px)
    return gantt.gantt(_gantt_trace(settings, run), step=step, t0_ms=t0_ms, t1_ms=t1_ms,
                       max_spans=max_spans, px=px)


@router.get("/{run_id}/gantt/steps")
def gantt_steps(run: RunDep, settings: SettingsDep) -> dict:
    """The trace's optimizer steps and their windows (ms from the trace start), for the step
    selector, without any span."""
    run_dir = settings.runs_dir / run.id
    if gantt_columnar.is_large(run_dir):
        info = gantt_columnar.run_info(run_dir)
        return {"steps": gantt_columnar.listed_steps(info["steps"]),
                "steps_total": len(info["steps"]), "ranks": len(info["meta"].ranks),
                "spans": None}  # not counted: the run is read one window at a time
    trace = _gantt_trace(settings, run)
    return {"steps": trace.steps, "ranks": len(gantt.rows_of(trace)),
            "spans": int(len(trace.cols["t0"]))}
