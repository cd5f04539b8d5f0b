"""A run's log: as text, or as server-sent events that resume after Last-Event-ID."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import PlainTextResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from backend import crud
from backend.api.deps import DbDep, RunDep, SettingsDep
from backend.core.db import get_sessionmaker
from backend.models import FINISHED

router = APIRouter(prefix="/api/runs", tags=["runs"])


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
