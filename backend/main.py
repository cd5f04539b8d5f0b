"""The FastAPI application: API under /api, the front end at /, OpenAPI at /docs."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles
from sqlalchemy.exc import DBAPIError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import compile_path

from backend import crud, storage
from backend.api.middleware import AuthMiddleware
from backend.api.routes import (
    advise,
    cluster,
    collective_sweeps,
    history,
    imports,
    internal,
    internal_nodes,
    meta,
    pages,
    predict,
    runs,
    schedules,
    sweeps,
    uploads,
    users,
)
from backend.api.routes import auth as auth_routes
from backend.api.schemas import NESTING_RULE, TEXT_PATTERN
from backend.core import memory
from backend.core.config import Settings, get_settings
from backend.core.db import get_engine, get_sessionmaker
from backend.core.security import LoginThrottle, check_startup
from backend.errors import DomainError, MethodNotAllowed, NotFound
from backend.migrate import schema_behind
from backend.services import run_traces
from backend.services.health import RecordRefusedWorkers
from backend.services.reconcile import reconciler
from backend.streams import hub
from jobs.spec import json_schema

log = logging.getLogger(__name__)


def _schema_behind(url: str) -> str | None:
    """backend.migrate.schema_behind, or None when that cannot be told (the database does
    not answer: the original error stands)."""
    try:
        return schema_behind(url)
    except Exception:  # noqa: BLE001 - only a better message is at stake
        return None
FRONTEND = Path(__file__).resolve().parent.parent / "frontend"
TRIM_EVERY_S = 5.0


async def _tidy_cache(release: bool) -> None:
    """Every few seconds: the scratch folders the trace cache let go deleted, and (`release`:
    Settings.heap_trim) the memory it freed handed back to the system (run_traces)."""
    from backend.services import run_traces
    while True:
        await asyncio.sleep(TRIM_EVERY_S)
        await asyncio.to_thread(run_traces.trim_if_dropped, release=release)


async def _sweep_leftovers(settings) -> None:
    """Once at startup, off the event loop: the half-written files a killed process left."""
    try:
        gone = await asyncio.to_thread(storage.sweep_leftovers, settings)
    except OSError as exc:  # a sweep that cannot read the data directory is not a failure
        log.warning("sweeping half-written files: %s", exc)
        return
    if gone:
        log.info("removed %d half-written files a stopped process left", len(gone))


async def _reaper(app: FastAPI) -> None:
    """Fail runs whose worker went silent. Waits one timeout after start-up first, so a backend
    restart never reaps runs whose heartbeats simply could not reach it while it was down."""
    settings: Settings = app.state.settings
    started = time.monotonic()
    maker = get_sessionmaker(settings.db_url)

    def reap():
        with maker() as db:
            # a multi-host run's silent node first: its run fails as "host X lost" and the
            # other nodes stop, before the run as a whole could look merely "worker lost"
            hosts = crud.reap_lost_nodes(db, timeout_s=settings.run_heartbeat_timeout_s)
            return list(dict.fromkeys([r for r, _, _ in hosts] + crud.reap_lost_runs(
                db, timeout_s=settings.run_heartbeat_timeout_s)))

    while True:
        await asyncio.sleep(min(5.0, settings.run_heartbeat_timeout_s / 3))
        if time.monotonic() - started < settings.run_heartbeat_timeout_s:
            continue
        if storage.recent_failure(settings.run_heartbeat_timeout_s):
            # The heartbeats that are missing may be ones this backend could not write (disk
            # full): as after a restart, give the workers one timeout once writes work again.
            continue
        try:
            lost = await run_in_threadpool(reap)
            if lost:
                log.warning("runs failed as worker lost: %s", lost)
            for run_id in lost:
                hub.publish_status(run_id, "failed")
        except Exception:  # the next round tries again
            log.exception("reaper round failed")


def _encodable(value):
    """An error body that echoes what the client sent (an unknown key, a path) as UTF-8: a lone
    surrogate becomes its escape text, so refusing it is not itself a 500."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, list | tuple):
        return [_encodable(v) for v in value]
    if isinstance(value, dict):
        return {_encodable(k): _encodable(v) for k, v in value.items()}
    return value


def _is_api(path: str) -> bool:
    return path == "/api" or path.startswith("/api/")


def _quiet_worker_channel(record: logging.LogRecord) -> bool:
    """Access-log filter: the worker channel's routine calls (heartbeats every few seconds, log
    batches, trace chunks) answered 2xx are not worth a terminal line each; its errors are."""
    args = record.args if isinstance(record.args, tuple) else ()
    if len(args) >= 5 and str(args[2]).startswith("/api/internal/"):
        return not (isinstance(args[4], int) and args[4] < 400)
    return True


# -- OpenAPI: the error answers, declared once for every operation ---------------------------
# What backend/errors.py maps each domain error to, and what the middleware answers itself.
ERROR_SCHEMA = {"title": "Error", "type": "object", "required": ["detail"], "properties": {
    "detail": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}]}}}
ERRORS = {
    "400": "Bad request: a Host not served here (docs/security.md), an unsafe file path",
    "401": "Authentication required, or a bad credential (team mode; the worker channel)",
    "403": "Not allowed: role, per-user limit, or a cross-site write (Origin)",
    "404": "No such run, user, token, comparison or file",
    "409": "The resource's state does not allow it (e.g. cancel a finished run)",
    "422": "A field breaks a rule: detail names each field and the rule",
    "429": "Throttled (failed logins); see Retry-After",
    "503": "A dependency (the job queue, the database) is unavailable",
    "507": "A write ran out of space (disk full, quota): what could not be written, and where",
}
WRITE_METHODS = ("post", "put", "patch", "delete")


def _errors_of(method: str, path: str) -> list[str]:
    """Every operation: 400 (Host), 401, 403, 422, 503 (a dependency down: the queue at
    submit, the database or broker in /api/health); with a path parameter: 404 (a missing
    resource); writes: 404 (a run the body names), 409, 429, 507 (state conflicts, throttling,
    out of space)."""
    codes = ["400", "401", "403", "422", "503"]
    if "{" in path or method in WRITE_METHODS:
        codes.append("404")
    if method in WRITE_METHODS:
        codes += ["409", "429", "507"]
    return codes


def declare_errors(schema: dict) -> None:
    schema.setdefault("components", {}).setdefault("schemas", {})["Error"] = ERROR_SCHEMA
    ref = {"$ref": "#/components/schemas/Error"}
    for path, operations in schema["paths"].items():
        for method, op in operations.items():
            responses = op.setdefault("responses", {})
            for code in _errors_of(method, path):
                responses.setdefault(code, {"description": ERRORS[code],
                                            "content": {"application/json": {"schema": ref}}})


def declare_text_rule(schema: dict) -> None:
    """The text rule deps.check_params enforces on every path and query parameter, stated in
    the schema of each string one (as SafeStr states it for body fields): a client, or a
    fuzzer, can then tell a valid request from one the API refuses. (File paths, which have
    a stricter rule of their own, refuse these characters too: storage.resolve_run_path.)"""
    for operations in schema["paths"].values():
        for op in operations.values():
            for param in op.get("parameters", ()):
                if param["in"] not in ("path", "query"):
                    continue
                sch = param["schema"]
                for alt in sch.get("anyOf", [sch]):
                    if alt.get("type") == "string" and "enum" not in alt:
                        alt.setdefault("pattern", TEXT_PATTERN)


def allowed_methods(app: FastAPI, path: str) -> list[str] | None:
    """The methods the OpenAPI schema declares at this path (the `Allow` of a 405; Starlette's
    names only the first matching route's), or None for a path outside the schema."""
    methods: set[str] = set()
    for template, operations in app.openapi()["paths"].items():
        if compile_path(template)[0].match(path):
            methods |= {m.upper() for m in operations}
    if "GET" in methods:
        methods.add("HEAD")
    return sorted(methods) or None


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    # Team mode refuses to start without a real secret key (ConfigError); the bind address is
    # checked where it is known (`paralab serve` / `paralab up`).
    check_startup(settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        if settings.heap_trim:  # before the request threads allocate (backend/core/memory.py)
            memory.limit_arenas()
        access = logging.getLogger("uvicorn.access")
        if _quiet_worker_channel not in access.filters:
            access.addFilter(_quiet_worker_channel)
        tasks = [asyncio.create_task(_reaper(app)), asyncio.create_task(reconciler(settings)),
                 asyncio.create_task(_sweep_leftovers(settings)),
                 asyncio.create_task(_tidy_cache(settings.heap_trim))]
        if settings.redis_url:  # several backend processes: share stream events
            hub.connect_redis(settings.redis_url)
        yield
        for task in tasks:
            task.cancel()
        hub.close()

    app = FastAPI(title="paralab", version="0.1.0", lifespan=lifespan,
                  description="Launch, trace and compare parallel-training experiments.")
    app.state.settings = settings
    run_traces.configure(settings.analysis_cache_mb, settings.data_dir.resolve() / "scratch")
    app.state.worker_token = settings.resolved_worker_token()
    app.state.login_throttle = {
        "user": LoginThrottle(settings.login_max_failures, settings.login_window_s),
        "addr": LoginThrottle(settings.login_max_failures_per_client, settings.login_window_s)}
    # Identity on every request, deny by default in team mode (backend/api/middleware.py).
    app.add_middleware(AuthMiddleware, settings=settings)
    # Outside it: remembers the worker channel's 401s for /api/health (services/health.py).
    app.add_middleware(RecordRefusedWorkers, settings=settings)
    storage.install_test_faults(get_engine(settings.db_url))  # TEST-ONLY, off unless its env

    @app.exception_handler(DomainError)
    async def _domain(request: Request, exc: DomainError):
        # The one place domain errors become HTTP: status from the class, {"detail": ...}.
        if exc.status == 404 and not _is_api(request.url.path):
            return pages.not_found_page(_encodable(str(exc)))
        return JSONResponse({"detail": _encodable(exc.detail)}, exc.status, headers=exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        cause = exc.__cause__
        if exc.status_code == 400 and isinstance(cause, RecursionError | ValueError):
            # FastAPI's bare "error parsing the body": say why the JSON parser gave up
            kind, msg = "json_invalid", f"JSON body could not be read: {str(cause).split(':')[0]}"
            if isinstance(cause, RecursionError):
                kind, msg = "json_too_deep", NESTING_RULE
            elif isinstance(cause, UnicodeDecodeError):
                msg = "JSON body must be UTF-8"
            return JSONResponse({"detail": [{"loc": ["body"], "msg": msg, "type": kind}]},
                                status_code=422)
        if exc.status_code == 404 and not _is_api(request.url.path):
            return pages.not_found_page(f"There is no page at {request.url.path}.")
        if exc.status_code == 405 and (allow := allowed_methods(app, request.url.path)):
            exc.headers = {**(exc.headers or {}), "Allow": ", ".join(allow)}
        return await http_exception_handler(request, exc)

    said = {"what": None, "at": 0.0}

    def _out_of_space(what: str, exc: Exception, local: bool = True):
        err = storage.storage_failed(what, settings.data_dir if local else None, exc)
        # every worker call fails alike while the disk is full: one line per cause a minute
        if err.detail != said["what"] or time.monotonic() - said["at"] > 60:
            log.error("%s", err.detail)
            said.update(what=err.detail, at=time.monotonic())
        return JSONResponse({"detail": err.detail}, err.status)

    @app.exception_handler(OSError)
    async def _os_error(_request, exc: OSError):
        # A full disk (or quota) is the operator's to fix and the client's to retry: 507 with
        # what could not be written, not a bare 500. Any other OSError stays a 500.
        if not storage.is_disk_full(exc):
            raise exc
        return _out_of_space(exc.filename or "a file", exc)

    @app.exception_handler(DBAPIError)
    async def _db_error(_request, exc: DBAPIError):
        if not storage.is_disk_full(exc):
            # a missing table or column: the database lags this code (a `paralab serve`
            # on a database nobody migrated) - the operator's to fix, said as such
            behind = await run_in_threadpool(_schema_behind, settings.db_url)
            if behind:
                log.error("%s", behind)
                return JSONResponse({"detail": behind}, 503)
            raise exc
        return _out_of_space(f"the database ({settings.db_url.split('@')[-1]})", exc,
                             local=settings.db_url.startswith("sqlite"))

    @app.exception_handler(RequestValidationError)
    async def _validation(_request, exc: RequestValidationError):
        errors = [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]}
                  for e in exc.errors()]
        return JSONResponse({"detail": _encodable(errors)}, status_code=422)

    app.include_router(runs.router)  # every /api/runs/... (routes/runs/)
    app.include_router(imports.router)
    app.include_router(uploads.router)
    app.include_router(meta.router)
    app.include_router(cluster.router)
    app.include_router(internal.router)
    app.include_router(internal_nodes.router)
    app.include_router(predict.router)
    app.include_router(collective_sweeps.router)
    app.include_router(advise.router)
    app.include_router(sweeps.router)
    app.include_router(sweeps.checks)
    app.include_router(schedules.router)
    app.include_router(auth_routes.router)
    app.include_router(users.router)
    app.include_router(history.router)
    app.include_router(pages.router)  # every HTML page
    app.mount("/static", StaticFiles(directory=FRONTEND / "static"), name="static")

    default_openapi = app.openapi

    def openapi() -> dict:
        """The generated schema, with the job spec's own JSON Schema as the body of
        POST /api/runs (the route takes a dict so that jobs.spec does the validating), and the
        error answers every operation can give declared once for all (declare_errors)."""
        if app.openapi_schema is None:
            schema = default_openapi()
            body = schema["paths"]["/api/runs"]["post"]["requestBody"]["content"][
                "application/json"]
            body["schema"] = json_schema()
            declare_errors(schema)
            declare_text_rule(schema)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi

    @app.get("/api/{rest:path}", include_in_schema=False)
    def api_404(rest: str):
        # A GET on a path that exists for other methods (POST /api/predict, ...) is a 405
        # naming them, not a 404: the catch-all must not hide the route
        path = f"/api/{rest}"
        if (allow := allowed_methods(app, path)) and "GET" not in allow:
            raise MethodNotAllowed(f"{path} takes {', '.join(allow)}, not GET", allow=allow)
        raise NotFound(f"no API route {path}")

    return app
