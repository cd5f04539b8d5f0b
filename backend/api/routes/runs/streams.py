"""A run's live streams (server-sent events): its log lines, and its status and trace growth
for the live run page. A waiting stream holds no database connection and no thread: it sleeps
on the run's topic in `backend.streams.hub`, takes caught-up lines from the topic's buffer, and
queries the database (a short session, in pages) only when it is behind that buffer, when it
starts, and after `settings.stream_recheck_s` without news (a lost pub/sub message costs
seconds, not the stream).

A backlog costs what it sends: each page is one query of columns (crud.log_page), formatted
in the reading thread, and the pages of every stream (and log download) go through one
limiter of PARALAB_STREAM_REPLAY_READS threads (backend/api/threads.py), none of them from the
pool page loads use. A rank filter moves the cursor over the lines it skips, in the buffer
and in the database alike, so it never reads them again."""

from __future__ import annotations

import asyncio
import re
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from backend import crud
from backend.api.deps import SettingsDep
from backend.api.schemas import INT32_MAX
from backend.api.threads import replay
from backend.core.db import get_sessionmaker
from backend.errors import Invalid, NotFound
from backend.models import FINISHED
from backend.streams import hub

router = APIRouter(prefix="/api/runs", tags=["runs"])

_NEWLINE = re.compile(r"\r\n|\r|\n")
TRACE_EVENTS_S = 1.0  # at most one "traces" event per stream and second: each one is a refetch
PAGE = 1000
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _sse(events: list[str], what: str) -> dict:
    """What the OpenAPI schema says a stream answers: server-sent events (not JSON), each
    described by `itemSchema` (OpenAPI 3.2's way; schemathesis checks every event)."""
    event = {"type": "object", "required": ["event", "data"], "properties": {
        "event": {"type": "string", "enum": events}, "data": {"type": "string"},
        "id": {"type": "string"}, "retry": {"type": "integer"}}}
    return {200: {"description": what,
                  "content": {"text/event-stream": {"itemSchema": event}}}}


def _status_of(settings, run_id: str) -> str:
    """The run's status (a short session of its own), or 404."""
    with get_sessionmaker(settings.db_url)() as db:
        run = crud.get_run(db, run_id)
        if run is None:
            raise NotFound(f"run {run_id!r} not found")
        return run.status


def read_page(settings, run_id: str, cursor: int, rank: int | None, limit: int = PAGE
              ) -> tuple[list[tuple[int, int | None, str]], int, bool, str | None]:
    """One page of the run's log after `cursor` (a short session of its own): the lines (of
    `rank`), the cursor after the page (the last seq it scanned), whether it was full (more
    may follow) and the run's status. Called through threads.replay."""
    with get_sessionmaker(settings.db_url)() as db:
        status = crud.run_status(db, run_id)
        rows = crud.log_page(db, run_id, cursor, rank=rank, limit=limit)
    lines = [x for x in rows if x[2] is not None]
    return lines, rows[-1][0] if rows else cursor, len(rows) == limit, status


def _sse_page(settings, run_id: str, cursor: int, rank: int | None):
    """read_page, its lines already written as events (in the reading thread, not the loop)."""
    lines, cursor, full, status = read_page(settings, run_id, cursor, rank)
    return _events(lines), cursor, full, status


def _event(data: str, *, event: str | None = None, id: int | None = None) -> str:
    head = (f"id: {id}\n" if id is not None else "") + (f"event: {event}\n" if event else "")
    # CR ends a line in SSE as LF does: either one in the data starts another `data:` line
    body = "\n".join(f"data: {part}" for part in _NEWLINE.split(data))
    return f"{head}{body}\n\n"


def _events(lines) -> str:
    """One write per batch: hundreds of open streams, one send each. (A line without CR or LF,
    nearly all, takes the short way: a replay formats a million of them.)"""
    return "".join([_event(line, id=seq) if "\n" in line or "\r" in line
                    else f"id: {seq}\ndata: {line}\n\n" for seq, _, line in lines])


@router.get("/{run_id}/logs/stream", response_class=StreamingResponse, responses=_sse(
    ["message", "status", "end"], "Server-sent events: `message`, a log line (`id`: its "
    "sequence number); `status`, the run's new status; `end`, the run has finished"))
async def stream_logs(
    request: Request, run_id: str, settings: SettingsDep,
    rank: int | None = Query(None, ge=0, le=INT32_MAX),
    last_event_id: Annotated[str | None, Header()] = None,
    after: int = Query(-1, ge=-1, le=INT32_MAX,
                       description="resume after this seq (or Last-Event-ID)"),
) -> StreamingResponse:
    """Server-sent events: `id` is the line's sequence number, so a reconnecting EventSource
    resumes exactly where it stopped; `event: status` on changes, `event: end` when done.
    Every input is checked here, before the 200: a stream cannot answer an error once begun."""
    if last_event_id and (seq := last_event_id.strip()).isascii() and seq.isdigit():
        if int(seq) > INT32_MAX:  # an ID this server never sent (seq is an INTEGER column)
            raise Invalid(f"last-event-id: must be a line's seq (0 to {INT32_MAX})",
                          field="last-event-id", where="header")
        after = int(seq)
    await run_in_threadpool(_status_of, settings, run_id)  # 404 before the stream starts

    async def events():
        cursor, sent_status = after, None
        with hub.subscribe(run_id) as sub:  # before the first read: nothing falls in between
            need_db = True
            while True:
                got = None if need_db else hub.lines_after(run_id, cursor, rank)
                status = hub.status(run_id)
                if got is None:
                    text, moved_to, need_db, status = await replay(
                        settings, _sse_page, settings, run_id, cursor, rank)
                    if status is None:  # the run was deleted meanwhile
                        return
                else:
                    text, moved_to = _events(got[0]), got[1]
                moved, cursor = moved_to != cursor, moved_to
                if text:
                    yield text
                if status and status != sent_status:
                    sent_status = status
                    yield _event(status, event="status")
                if sent_status in FINISHED and not moved and not need_db:
                    yield _event(sent_status, event="end")
                    return
                # (a client that goes away cancels this generator: StreamingResponse listens
                # for the disconnect itself, so no per-iteration check is needed)
                if not moved and not await sub.wait(settings.stream_recheck_s):
                    need_db = True  # no news for a while: make sure nothing was missed
                    yield ": ping\n\n"

    return StreamingResponse(events(), media_type="text/event-stream", headers=SSE_HEADERS)


@router.get("/{run_id}/live", response_class=StreamingResponse, responses=_sse(
    ["status", "traces", "end"], "Server-sent events: `status`, `traces` (they have grown), "
    "`end` (the run has finished)"))
async def stream_live(request: Request, run_id: str, settings: SettingsDep) -> StreamingResponse:
    """What the live run page redraws on: `event: status` when the run's status changes,
    `event: traces` when its traces have grown (at most one a second; the page then refetches
    GET /metrics, which analyses the partial traces), `event: end` once it is finished: a
    status change is sent at once, never held back by the traces' one-second window."""
    status = await run_in_threadpool(_status_of, settings, run_id)

    async def events():
        sent_status, seen = None, -1
        loop = asyncio.get_running_loop()
        with hub.subscribe(run_id) as sub:
            cur = status
            while True:
                v = hub.version(run_id)
                if cur != sent_status:
                    sent_status = cur
                    yield _event(cur, event="status")
                if cur in FINISHED:
                    yield _event(cur, event="end")
                    return
                if v != seen:
                    seen = v
                    yield _event(str(v), event="traces")
                if await sub.wait(settings.stream_recheck_s):
                    cur = hub.status(run_id) or cur
                    # trace growth: coalesce a burst into one event, but leave the window at
                    # once on a status change (a sleep here held every finished run's `end`
                    # back by up to TRACE_EVENTS_S: `paralab submit --wait` waits on it)
                    end = loop.time() + TRACE_EVENTS_S
                    while cur == sent_status and (left := end - loop.time()) > 0:
                        if await sub.wait(left):
                            cur = hub.status(run_id) or cur
                else:
                    cur = await run_in_threadpool(_status_of, settings, run_id)
                    yield ": ping\n\n"

    return StreamingResponse(events(), media_type="text/event-stream", headers=SSE_HEADERS)
