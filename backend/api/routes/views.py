"""Data shaped for the dashboard's charts, and the dashboard's pages (issue 7).

Chart data is computed from the run's trace files by `backend.views` (cached per file version);
pages are static HTML templates whose ES modules fetch everything through /api."""

from __future__ import annotations

import re
from pathlib import Path

from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse
from starlette.background import BackgroundTask

from backend import crud, views
from backend.api.deps import DbDep, RunDep, SettingsDep
from jobs.spec import SpecError

router = APIRouter(tags=["views"])
FRONTEND = Path(__file__).resolve().parents[3] / "frontend"
_RUN_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
TABLES = ("step_rank", "collectives", "axis_bytes", "memory", "rank_comm")


def _trace(settings, run) -> views.Trace | None:
    return views.load_trace(settings.runs_dir / run.id)


def _need_trace(settings, run) -> views.Trace:
    trace = _trace(settings, run)
    if trace is None:
        raise HTTPException(404, f"run {run.id} has no trace files (yet)")
    return trace


@router.get("/api/runs/{run_id}/gantt")
def gantt(run: RunDep, settings: SettingsDep,
          step: int | None = Query(None, ge=-1, description="one optimizer step"),
          t0_ms: float | None = Query(None, description="window start, ms from the trace start"),
          t1_ms: float | None = Query(None, description="window end, ms from the trace start"),
          max_spans: int = Query(20000, ge=100, le=100000,
                                 description="bound on the segments returned (level of detail)"),
          px: int = Query(2000, ge=100, le=10000, description="drawing width in pixels")) -> dict:
    """Per-rank Gantt segments of a window. When the window holds more than `max_spans` spans,
    spans closer than a bucket width are merged (`n` > 1), so the answer stays bounded."""
    return views.gantt(_need_trace(settings, run), step=step, t0_ms=t0_ms, t1_ms=t1_ms,
                       max_spans=max_spans, px=px)


@router.get("/api/runs/{run_id}/gantt/steps")
def gantt_steps(run: RunDep, settings: SettingsDep) -> dict:
    """The trace's optimizer steps and their windows (ms from the trace start), for the step
    selector, without any span."""
    trace = _need_trace(settings, run)
    return {"steps": trace.steps, "ranks": len(views.rows_of(trace)),
            "spans": int(len(trace.cols["t0"]))}


@router.get("/api/runs/{run_id}/breakdown")
def breakdown(run: RunDep, settings: SettingsDep) -> dict:
    """Step time per (step, rank): compute / exposed comm / bubble / idle seconds."""
    return views.breakdown(_need_trace(settings, run))


@router.get("/api/runs/{run_id}/comm")
def comm(db: DbDep, run: RunDep, settings: SettingsDep) -> dict:
    """Bytes per mesh axis, per-collective busbw by size, overlap per rank, stragglers, and
    the latest collective sweep to compare against."""
    out = views.comm_view(_need_trace(settings, run))
    out["sweep"] = _latest_sweep(db, run.queue)
    return out


def _latest_sweep(db, queue: str | None = None) -> dict | None:
    rows, _ = crud.list_runs(db, crud.RunFilter(status="succeeded", strategy="collective-sweep"),
                             limit=20)
    rows = sorted(rows, key=lambda r: r.queue != queue)  # prefer the same host's sweep
    for r in rows:
        if isinstance(r.summary, dict) and r.summary.get("results"):
            return _sweep_out(r)
    return None


def _sweep_out(r) -> dict:
    s = r.summary or {}
    return {"id": r.id, "name": r.name, "created_at": r.created_at, "queue": r.queue,
            "world_size": r.world_size, "backend": s.get("backend"), "device": s.get("device"),
            "copy_bandwidth_GBps": s.get("copy_bandwidth_GBps"),
            "results": [{k: x.get(k) for k in ("op", "algorithm", "bytes", "time_us_mean",
                                               "algbw_GBps", "busbw_GBps", "correct")}
                        for x in s.get("results") or []]}


@router.get("/api/sweeps")
def sweeps(db: DbDep, ids: str | None = Query(None, description="comma-separated run IDs"),
           limit: int = Query(20, ge=1, le=100)) -> list[dict]:
    """Collective-sweep runs with their result tables: the given IDs, else the latest."""
    if ids:
        runs = [crud.get_run(db, i) for i in ids.split(",")[:20]]
        runs = [r for r in runs if r is not None]
    else:
        runs, _ = crud.list_runs(db, crud.RunFilter(status="succeeded",
                                                    strategy="collective-sweep"), limit=limit)
    return [_sweep_out(r) for r in runs if isinstance(r.summary, dict)]


@router.get("/api/runs/{run_id}/memory")
def memory(run: RunDep, settings: SettingsDep) -> dict:
    """Peak memory per rank and component from the trace, next to the theory model's figure."""
    from jobs.theory import predict
    try:
        prediction = predict(run.spec) if run.spec and run.kind == "train" else None
    except (SpecError, ValueError, TypeError):
        prediction = None
    return views.memory_view(_trace(settings, run), prediction)


@router.get("/api/runs/{run_id}/tables/{name}.{fmt}")
def table(run: RunDep, settings: SettingsDep, name: str, fmt: str):
    """The dashboard's tables as CSV or JSON: step_rank, collectives, axis_bytes, memory,
    rank_comm."""
    if name not in TABLES or fmt not in ("csv", "json"):
        raise HTTPException(404, f"tables: one of {', '.join(TABLES)} as .csv or .json")
    if name == "memory":
        rows = memory(run, settings)["rows"]
    elif name == "step_rank":
        rows = views.breakdown(_need_trace(settings, run))["rows"]
    else:
        c = views.comm_view(_need_trace(settings, run))
        rows = c["ranks"] if name == "rank_comm" else c[name]
    fname = f"{run.id}-{name}.{fmt}"
    disp = {"Content-Disposition": f'attachment; filename="{fname}"'}
    if fmt == "json":
        return JSONResponse(rows, headers=disp)
    return PlainTextResponse(views.to_csv(rows), media_type="text/csv", headers=disp)


# --- pages and the vendored plotly.js -------------------------------------------------------------

@router.get("/static/vendor/plotly.min.js", include_in_schema=False)
def plotly_js() -> FileResponse:
    import plotly
    path = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    return FileResponse(path, media_type="text/javascript",
                        headers={"Cache-Control": "public, max-age=86400"})


def _page(name: str) -> FileResponse:
    return FileResponse(FRONTEND / "templates" / name, headers={"Cache-Control": "no-cache"})


@router.get("/new", include_in_schema=False)
def page_new() -> FileResponse:
    return _page("new.html")


@router.get("/runs/{run_id}", include_in_schema=False)
def page_run(run_id: str, settings: SettingsDep) -> FileResponse:
    """The run page. After sending it, parse the run's trace in the background, so the parse
    overlaps the browser loading plotly.js and the first chart request finds it cached."""
    page = _page("run.html")
    if _RUN_ID.match(run_id):
        page.background = BackgroundTask(views.load_trace, settings.runs_dir / run_id)
    return page


@router.get("/compare", include_in_schema=False)
def page_compare() -> FileResponse:
    return _page("compare.html")


@router.get("/collectives", include_in_schema=False)
def page_collectives() -> FileResponse:
    return _page("collectives.html")


@router.get("/schedules", include_in_schema=False)
def page_schedules() -> FileResponse:
    return _page("schedules.html")
