"""Every HTML page of the dashboard, and the vendored plotly.js. Pages are Jinja2 templates
(frontend/templates/, all extending base.html, which holds the nav bar once) whose ES modules
fetch everything through /api; no page reads the database."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import jinja2
from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response
from starlette.background import BackgroundTask

from backend import crud
from backend.api.deps import DbDep, SettingsDep
from backend.errors import NotFound
from backend.services import run_traces

router = APIRouter(include_in_schema=False)
FRONTEND = Path(__file__).resolve().parents[3] / "frontend"
_RUN_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# The login page runs before anyone is known: the strictest policy that still lets it work.
LOGIN_CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; object-src 'none'; "
             "base-uri 'none'; frame-ancestors 'none'; form-action 'self'")
_templates = jinja2.Environment(loader=jinja2.FileSystemLoader(FRONTEND / "templates"),
                                autoescape=True)


def render_page(name: str, **values: str) -> bytes:
    """A page's HTML. Pages take no per-request data (only the 404 page names what was
    missing, autoescaped), so the same bytes go to everyone."""
    return _templates.get_template(name).render(**values).encode()


def not_found_page(message: str) -> HTMLResponse:
    return HTMLResponse(render_page("404.html", message=message), status_code=404,
                        headers={"Cache-Control": "no-store"})


def _page(request: Request, name: str, headers: dict[str, str] | None = None) -> Response:
    body = render_page(name)
    etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
    # no-cache + ETag: the browser revalidates each time (a deployment's new page is never
    # served stale) and gets a 304 without the body when nothing changed.
    headers = {"Cache-Control": "no-cache", "ETag": etag, **(headers or {})}
    if etag in request.headers.get("if-none-match", ""):
        return Response(status_code=304, headers=headers)
    return HTMLResponse(body, headers=headers)


@router.get("/static/vendor/plotly.min.js")
def plotly_js() -> FileResponse:
    import plotly
    path = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    return FileResponse(path, media_type="text/javascript",
                        headers={"Cache-Control": "public, max-age=86400"})


@router.get("/")
def page_index(request: Request) -> Response:
    return _page(request, "index.html")


@router.get("/login")
def page_login(request: Request, settings: SettingsDep) -> Response:
    if settings.auth != "required":
        return RedirectResponse("/", 303)
    return _page(request, "login.html", {"Cache-Control": "no-store",
                                         "Content-Security-Policy": LOGIN_CSP})


@router.get("/new")
def page_new(request: Request) -> Response:
    return _page(request, "new.html")


@router.get("/import")
def page_import(request: Request) -> Response:
    """Profiler traces made elsewhere -> a run (POST /api/imports, docs/dashboard.md)."""
    return _page(request, "import.html")


@router.get("/runs/{run_id}")
def page_run(request: Request, run_id: str, settings: SettingsDep, db: DbDep) -> Response:
    """The run page (an HTML 404 for an unknown run, not an empty skeleton). After sending it,
    parse the run's trace in the background, so the parse overlaps the browser loading
    plotly.js and the first chart request finds it cached."""
    if not _RUN_ID.match(run_id) or crud.get_run(db, run_id) is None:
        raise NotFound(f"run {run_id!r} not found")
    page = _page(request, "run.html")
    if _RUN_ID.match(run_id):
        page.background = BackgroundTask(run_traces.warm, settings.runs_dir / run_id)
    return page


@router.get("/compare")
def page_compare(request: Request) -> Response:
    return _page(request, "compare.html")


@router.get("/advise")
def page_advise(request: Request) -> Response:
    return _page(request, "advise.html")


@router.get("/collectives")
def page_collectives(request: Request) -> Response:
    return _page(request, "collectives.html")


@router.get("/schedules")
def page_schedules(request: Request) -> Response:
    return _page(request, "schedules.html")


@router.get("/cluster")
def page_cluster(request: Request) -> Response:
    return _page(request, "cluster.html")


@router.get("/sweeps")
def page_sweeps(request: Request) -> Response:
    return _page(request, "sweeps.html")


@router.get("/sweeps/{sweep_id}")
def page_sweep(request: Request, sweep_id: str, db: DbDep) -> Response:
    if not _RUN_ID.match(sweep_id) or crud.get_sweep(db, sweep_id) is None:
        raise NotFound(f"sweep {sweep_id!r} not found")
    return _page(request, "sweep.html")
