"""Annotated dependencies shared by the routes."""

from __future__ import annotations

import dataclasses
import hmac
from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Header, Request
from sqlalchemy.orm import Session
from starlette.convertors import PathConvertor

from backend import crud
from backend.core.config import Settings
from backend.core.db import get_sessionmaker
from backend.core.identity import Principal, principal_of
from backend.errors import Invalid, NotFound, Unauthorized
from backend.models import Run
from jobs.spec import text_problem


def check_params(request: Request) -> None:
    """Every router's first dependency: the text rule (jobs.spec.text_problem) on every path
    and query parameter, declared or not, before any of them reaches the database (a NUL is a
    422 on both databases, not a 500 on PostgreSQL and a miss on SQLite). A file path (a
    `{name:path}` parameter) keeps its own stricter rule, storage.resolve_run_path (400)."""
    convertors = getattr(request.scope.get("route"), "param_convertors", {})
    for where, items in (("path", request.path_params.items()),
                         ("query", request.query_params.multi_items())):
        for name, value in items:
            if where == "path" and isinstance(convertors.get(name), PathConvertor):
                continue
            if isinstance(value, str) and (problem := text_problem(value)):
                raise Invalid(f"{name}: {problem}", field=name, where=where)


CheckedParams = Depends(check_params)


def get_app_settings(request: Request) -> Settings:
    return request.app.state.settings


SettingsDep = Annotated[Settings, Depends(get_app_settings)]


def get_db(settings: SettingsDep) -> Iterator[Session]:
    with get_sessionmaker(settings.db_url)() as session:
        yield session


DbDep = Annotated[Session, Depends(get_db)]


def current_user(request: Request, settings: SettingsDep) -> Principal:
    """Who is calling. Team mode: the identity AuthMiddleware established (it already answered
    401 when there was none). Local mode: the implicit admin `local`, a row created on first
    use. Runs' `owner` is `user.username`."""
    principal = getattr(request.state, "principal", None)
    if principal is not None:
        return principal
    if settings.auth == "required":  # unreachable behind AuthMiddleware; fail closed anyway
        raise Unauthorized("authentication required")
    cached = getattr(request.app.state, "local_principal", None)
    if cached is None:
        with get_sessionmaker(settings.db_url)() as db:
            cached = principal_of(crud.local_user(db), settings, via="local")
        cached = dataclasses.replace(cached, role="admin")
        request.app.state.local_principal = cached
    return cached


UserDep = Annotated[Principal, Depends(current_user)]


def require_worker(request: Request,
                   authorization: Annotated[str | None, Header()] = None) -> str:
    """The worker channel: a bearer token only workers hold."""
    expected = request.app.state.worker_token
    token = (authorization or "").removeprefix("Bearer ").strip()
    if not token or not hmac.compare_digest(token.encode(), expected.encode()):
        raise Unauthorized("worker credential required")
    return "worker"


WorkerDep = Annotated[str, Depends(require_worker)]


def get_run_or_404(run_id: str, db: DbDep) -> Run:
    run = db.get(Run, run_id)
    if run is None:
        raise NotFound(f"run {run_id!r} not found")
    return run


RunDep = Annotated[Run, Depends(get_run_or_404)]
