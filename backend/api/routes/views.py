"""The collective-sweep list and the dashboard's pages. Run figures and the Gantt are served by
routes/analysis.py; pages are static HTML templates whose ES modules fetch through /api."""

from __future__ import annotations

import re
from pathlib import Path

from fastapi import APIRouter, Query
from fastapi.responses import FileResponse
from starlette.background import BackgroundTask

from backend import crud, run_traces
from backend.api.deps import DbDep, SettingsDep

router = APIRouter(tags=["views"])
FRONTEND = Path(__file__).resolve().parents[3] / "frontend"
_RUN_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


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
        page.background = BackgroundTask(run_traces.warm, settings.runs_dir / run_id)
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
