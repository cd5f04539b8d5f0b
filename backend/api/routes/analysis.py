"""Analysis of finished runs: metrics tables and trace export (issue 5).

The worker runs `jobs.analysis.write_analysis` after the job and uploads `analysis.json` and
`trace.perfetto.json` with the run's other files; these routes serve them. Definitions of every
table and metric: docs/analysis.md.
"""

from __future__ import annotations

import json
from typing import Literal

from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import FileResponse, Response
from sqlalchemy import select

from backend.api.deps import DbDep, RunDep, SettingsDep
from backend.models import Run
from backend.storage import resolve_run_path
from jobs.analysis import ANALYSIS_FILE, PERFETTO_FILE, TABLES, tables_to_csv
from jobs.analysis.history import bandwidth_vs_sweep

router = APIRouter(prefix="/api", tags=["analysis"])

_TABLE_DOC = f"one table: {', '.join(TABLES)}"


def _bad_query(field: str, msg: str) -> HTTPException:
    return HTTPException(422, [{"loc": ["query", field], "msg": msg, "type": "value_error"}])


def _check_table(table: str | None) -> None:
    if table is not None and table not in TABLES:
        raise _bad_query("table", f"unknown table {table!r} (tables: {', '.join(TABLES)})")


def _run_file(settings, run, name: str, what: str):
    path = resolve_run_path(settings.runs_dir, run.id, name)
    if not path.is_file():
        raise HTTPException(404, f"run {run.id} has no {what} yet (status {run.status}): the "
                                 "worker writes it when the job ends")
    return path


def load_analysis(settings, run) -> dict:
    path = _run_file(settings, run, ANALYSIS_FILE, "analysis")
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise HTTPException(500, f"run {run.id}: stored analysis is unreadable ({exc})") from exc


def latest_sweep(db, run) -> Run | None:
    """The newest succeeded bandwidth sweep on the same worker queue (one queue per host)."""
    q = (select(Run).where(Run.kind == "collective_bench", Run.status == "succeeded",
                           Run.queue == run.queue, Run.id != run.id)
         .order_by(Run.created_at.desc()).limit(20))
    return next((r for r in db.scalars(q) if (r.summary or {}).get("results")), None)


def sweep_join(db, run, analysis: dict) -> dict | None:
    sweep = latest_sweep(db, run)
    if sweep is None:
        return None
    rows = bandwidth_vs_sweep((analysis.get("tables") or {}).get("collectives") or [],
                              sweep.summary)
    return {"sweep_run_id": sweep.id, "queue": sweep.queue,
            "created_at": sweep.created_at.isoformat() if sweep.created_at else None,
            "rows": rows}


@router.get("/runs/{run_id}/metrics")
def get_metrics(run: RunDep, settings: SettingsDep, db: DbDep,
                table: str | None = Query(None, description=_TABLE_DOC),
                offset: int = Query(0, ge=0, description="with table: first row"),
                limit: int | None = Query(None, ge=1, description="with table: at most rows"),
                ) -> dict:
    """The run's analysis (headline, tables, warnings) plus `bandwidth_vs_sweep` (its
    collectives next to the latest bandwidth sweep of the same hosts, or null), or one
    table's rows with `?table=` (paged by offset / limit; `total` counts them all)."""
    _check_table(table)
    analysis = load_analysis(settings, run)
    if table is None:
        return {**analysis, "bandwidth_vs_sweep": sweep_join(db, run, analysis)}
    rows = (analysis.get("tables") or {}).get(table, [])
    end = None if limit is None else offset + limit
    return {"run_id": run.id, "table": table, "total": len(rows), "offset": offset,
            "rows": rows[offset:end]}


@router.get("/runs/{run_id}/export")
def export_run(run: RunDep, settings: SettingsDep,
               format: Literal["perfetto", "json", "csv"] = Query(
                   "perfetto", description="perfetto: Chrome-trace JSON of the whole run; json: "
                   "the tables (or one); csv: one table"),
               table: str | None = Query(None, description=_TABLE_DOC + " (required for csv)"),
               ) -> Response:
    """Download the Perfetto trace, the tables as JSON, or one table as CSV."""
    _check_table(table)
    if format == "perfetto":
        path = _run_file(settings, run, PERFETTO_FILE, "Perfetto trace")
        return FileResponse(path, media_type="application/json",
                            filename=f"paralab-{run.id}.perfetto.json")
    if format == "csv" and table is None:
        raise _bad_query("table", "required for format=csv: " + _TABLE_DOC)
    analysis = load_analysis(settings, run)
    tables = analysis.get("tables") or {}
    if format == "csv":
        body, media, name = tables_to_csv({table: tables.get(table, [])}, table), "text/csv", \
            f"paralab-{run.id}-{table}.csv"
    elif table is not None:
        body, media, name = json.dumps(tables.get(table, [])), "application/json", \
            f"paralab-{run.id}-{table}.json"
    else:
        body, media, name = json.dumps(analysis), "application/json", \
            f"paralab-{run.id}-analysis.json"
    return Response(body, media_type=media,
                    headers={"Content-Disposition": f'attachment; filename="{name}"'})
