"""Runs: submit, list, inspect, cancel, logs (text and SSE), files."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Body, Header, HTTPException, Query, Request
from fastapi.responses import FileResponse, PlainTextResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from backend import crud, services
from backend.api.deps import DbDep, RunDep, SettingsDep, UserDep
from backend.api.schemas import FileOut, RunOut, RunPage
from backend.core.db import get_sessionmaker
from backend.models import FINISHED
from backend.storage import resolve_run_path

router = APIRouter(prefix="/api/runs", tags=["runs"])

_SPEC_EXAMPLE = {"preset": "ddp", "name": "my first run", "train": {"steps": 5},
                 "tags": ["demo"], "notes": ""}


@router.post("", status_code=201, response_model=RunOut)
def submit_run(
    db: DbDep, settings: SettingsDep, user: UserDep,
    body: Annotated[dict[str, Any], Body(
        description="A job spec, or {\"preset\": NAME, ...overrides} (nested fields merged); "
                    "optional run metadata `tags` (list of strings) and `notes`.",
        examples=[_SPEC_EXAMPLE])],
    force: bool = Query(False, description="submit even if predicted memory exceeds what the "
                        "workers report"),
) -> RunOut:
    run = services.submit(db, settings, body, owner=user, force=force)
    return RunOut.of(run)


@router.get("", response_model=RunPage)
def list_runs(
    db: DbDep,
    status: str | None = Query(None, description="comma-separated statuses"),
    strategy: str | None = Query(None, description="comma-separated strategy labels"),
    owner: str | None = None,
    tag: str | None = None,
    q: str | None = Query(None, max_length=200, description="text search in name/notes"),
    sort: str = Query("-created_at", pattern=r"^-?(created_at|name|status|strategy|world_size)$"),
    cursor: str | None = None,
    limit: int = Query(50, ge=1, le=500),
) -> RunPage:
    f = crud.RunFilter(status=status, strategy=strategy, owner=owner, tag=tag, q=q)
    try:
        rows, nxt = crud.list_runs(db, f, sort=sort, cursor=cursor, limit=limit)
    except ValueError as exc:
        raise HTTPException(422, [{"loc": ["query", "cursor"], "msg": str(exc),
                                   "type": "value_error"}]) from exc
    return RunPage(items=[RunOut.of(r, full=False) for r in rows], next_cursor=nxt)


@router.get("/{run_id}", response_model=RunOut)
def get_run(run: RunDep) -> RunOut:
    return RunOut.of(run)


@router.post("/{run_id}/cancel", response_model=RunOut)
def cancel_run(db: DbDep, run: RunDep, settings: SettingsDep) -> RunOut:
    if run.status in FINISHED:
        raise HTTPException(409, f"run {run.id} already {run.status}")
    return RunOut.of(services.cancel(db, settings, run))


@router.get("/{run_id}/logs", response_class=PlainTextResponse)
def get_logs(db: DbDep, run: RunDep, rank: int | None = Query(None, ge=0),
             after: int = Query(-1, ge=-1)) -> str:
    lines: list[str] = []
    while True:
        batch = crud.logs_after(db, run.id, after, rank=rank, limit=5000)
        lines += [x.line for x in batch]
        if len(batch) < 5000:
            break
        after = batch[-1].seq
    return "\n".join(lines) + ("\n" if lines else "")


@router.get("/{run_id}/logs/stream")
async def stream_logs(
    request: Request, run: RunDep, settings: SettingsDep,
    rank: int | None = Query(None, ge=0),
    last_event_id: Annotated[str | None, Header()] = None,
    after: int = Query(-1, ge=-1, description="resume after this seq (or Last-Event-ID)"),
) -> StreamingResponse:
    """Server-sent events: `id` is the line's sequence number, so a reconnecting EventSource
    resumes exactly where it stopped; `event: status` on changes, `event: end` when done."""
    if last_event_id and last_event_id.strip().isdigit():
        after = int(last_event_id)
    maker = get_sessionmaker(settings.db_url)
    run_id = run.id

    def poll(cursor: int):
        with maker() as db:
            r = crud.get_run(db, run_id)
            return crud.logs_after(db, run_id, cursor, rank=rank, limit=1000), r.status

    async def events():
        cursor, last_status = after, None
        while True:
            batch, status = await run_in_threadpool(poll, cursor)
            for x in batch:
                cursor = x.seq
                data = "\n".join(f"data: {part}" for part in x.line.split("\n"))
                yield f"id: {x.seq}\n{data}\n\n"
            if status != last_status:
                last_status = status
                yield f"event: status\ndata: {status}\n\n"
            if status in FINISHED and not batch:
                yield f"event: end\ndata: {status}\n\n"
                return
            if await request.is_disconnected():
                return
            if not batch:
                await asyncio.sleep(0.5)

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


@router.get("/{run_id}/files", response_model=list[FileOut])
def list_files(db: DbDep, run: RunDep) -> list[FileOut]:
    return [FileOut(path=f.path, size=f.size, sha256=f.sha256, created_at=f.created_at)
            for f in crud.list_files(db, run.id)]


@router.get("/{run_id}/files/{path:path}")
def download_file(run: RunDep, settings: SettingsDep, path: str) -> FileResponse:
    try:
        target = resolve_run_path(settings.runs_dir, run.id, path)
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from exc
    if not target.is_file():
        raise HTTPException(404, f"no file {path!r} in run {run.id}")
    return FileResponse(target, filename=target.name)
