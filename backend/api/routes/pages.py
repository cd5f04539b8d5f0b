"""Every HTML page of the dashboard, and the vendored plotly.js. Pages are HTML templates whose
ES modules fetch everything through /api; no page reads the database."""

from __future__ import annotations

import re
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse, RedirectResponse
from starlette.background import BackgroundTask

from backend import run_traces
from backend.api.deps import SettingsDep

router = APIRouter(include_in_schema=False)
FRONTEND = Path(__file__).resolve().parents[3] / "frontend"
_RUN_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# The login page runs before anyone is known: the strictest policy that still lets it work.
LOGIN_CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; object-src 'none'; "
             "base-uri 'none'; frame-ancestors 'none'; form-action 'self'")


@router.get("/static/vendor/plotly.min.js")
def plotly_js() -> FileResponse:
    import plotly
    path = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    return FileResponse(path, media_type="text/javascript",
                        headers={"Cache-Control": "public, max-age=86400"})


def _page(name: str) -> FileResponse:
    # no-cache: revalidate each time, so a deployment's new page is never served stale
    return FileResponse(FRONTEND / "templates" / name, headers={"Cache-Control": "no-cache"})


@router.get("/")
def page_index() -> FileResponse:
    return _page("index.html")


@router.get("/login")
def page_login(settings: SettingsDep):
    if settings.auth != "required":
        return RedirectResponse("/", 303)
    return FileResponse(FRONTEND / "templates" / "login.html", headers={
        "Cache-Control": "no-store", "Content-Security-Policy": LOGIN_CSP})


@router.get("/new")
def page_new() -> FileResponse:
    return _page("new.html")


@router.get("/runs/{run_id}")
def page_run(run_id: str, settings: SettingsDep) -> FileResponse:
    """The run page. After sending it, parse the run's trace in the background, so the parse
    overlaps the browser loading plotly.js and the first chart request finds it cached."""
    page = _page("run.html")
    if _RUN_ID.match(run_id):
        page.background = BackgroundTask(run_traces.warm, settings.runs_dir / run_id)
    return page


@router.get("/compare")
def page_compare() -> FileResponse:
    return _page("compare.html")


@router.get("/collectives")
def page_collectives() -> FileResponse:
    return _page("collectives.html")


@router.get("/schedules")
def page_schedules() -> FileResponse:
    return _page("schedules.html")
