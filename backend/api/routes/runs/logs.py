"""A run's log as text, in pages (`?after=&limit=`) or as one download streamed in pages (its
live stream: streams.py). Memory per request is one page, whatever the log's length; the
pages are read through the replay limiter the streams use (backend/api/threads.py)."""

from __future__ import annotations

from urllib.parse import urlencode

from fastapi import APIRouter, Query
from fastapi.responses import PlainTextResponse, StreamingResponse

from backend.api.deps import SettingsDep
from backend.api.routes.runs.streams import PAGE, read_page
from backend.api.schemas import INT32_MAX
from backend.api.threads import replay
from backend.errors import NotFound

router = APIRouter(prefix="/api/runs", tags=["runs"])

LIMIT = 10_000  # lines a page scans unless ?limit= says otherwise
LIMIT_MAX = 100_000
# A page also ends once it holds this many characters (a line may hold 64 Ki of them): a
# request's memory is bounded whatever its lines (and `limit`).
PAGE_CHARS = 4 << 20

# (rank and seq are INTEGER columns: a larger bound would overflow the query)
Rank = Query(None, ge=0, le=INT32_MAX, description="this rank's lines (and those of no rank)")

_TEXT = {"text/plain": {"schema": {"type": "string"}}}
_PAGE_HEADERS = {
    "X-Next-After": {"description": "the seq this page ended at: pass it as `after` to read "
                     "on (equal to `after` when there was nothing new)",
                     "schema": {"type": "integer"}},
    "Link": {"description": '`<...?after=N&limit=L>; rel="next"` when the page is full (by '
             "`limit` or by size), so more may follow at once; absent at the end of the log",
             "schema": {"type": "string"}}}


def _text_page(settings, run_id: str, after: int, rank: int | None, limit: int
               ) -> tuple[str, int, bool, str | None]:
    """Up to `limit` lines after `after` (fewer with `rank`: the lines of other ranks are
    scanned, not sent), ending early past PAGE_CHARS; the text, the seq it ended at, whether
    more may follow, and the run's status (None: no such run). Reads PAGE rows at a time."""
    out, size, cursor, left = [], 0, after, limit
    while left > 0:
        n = min(PAGE, left)
        lines, end, full, status = read_page(settings, run_id, cursor, rank, n)
        if status is None:
            return "", after, False, None
        for seq, _, line in lines:
            if size >= PAGE_CHARS:  # full by size: the page ends before this line
                return "".join(out), cursor, True, status
            out.append(line + "\n")
            size += len(line) + 1
            cursor = seq
        cursor, left = end, left - n
        if not full:
            return "".join(out), cursor, False, status
    return "".join(out), cursor, True, status


async def _page_or_404(settings, run_id: str, after: int, rank: int | None, limit: int):
    text, cursor, more, status = await replay(settings, _text_page, settings, run_id, after,
                                              rank, limit)
    if status is None:
        raise NotFound(f"run {run_id!r} not found")
    return text, cursor, more


@router.get("/{run_id}/logs", response_class=PlainTextResponse, responses={
    200: {"description": "the page's lines, one per line", "content": _TEXT,
          "headers": _PAGE_HEADERS}})
async def get_logs(run_id: str, settings: SettingsDep, rank: int | None = Rank,
                   after: int = Query(-1, ge=-1, le=INT32_MAX,
                                      description="the lines after this seq (X-Next-After)"),
                   limit: int = Query(LIMIT, ge=1, le=LIMIT_MAX,
                                      description="lines to scan (with `rank`, those of other "
                                      "ranks are scanned but not sent)")) -> PlainTextResponse:
    """One page of the run's log: follow `X-Next-After` (or the `Link` rel="next") until the
    answer has no `Link`. The whole log at once: GET .../logs/download."""
    text, cursor, more = await _page_or_404(settings, run_id, after, rank, limit)
    headers = {"X-Next-After": str(cursor)}
    if more:
        query = urlencode({"after": cursor, "limit": limit,
                           **({"rank": rank} if rank is not None else {})})
        headers["Link"] = f'</api/runs/{run_id}/logs?{query}>; rel="next"'
    return PlainTextResponse(text, headers=headers)


@router.get("/{run_id}/logs/download", response_class=StreamingResponse, responses={
    200: {"description": "the whole log as a file, sent page by page", "content": _TEXT}})
async def download_logs(run_id: str, settings: SettingsDep,
                        rank: int | None = Rank) -> StreamingResponse:
    """The run's whole log (as far as it goes when the download reaches its end), streamed
    from the database one page at a time: memory stays one page, whatever its length."""
    text, cursor, more = await _page_or_404(settings, run_id, -1, rank, PAGE)  # 404 first

    async def pages():
        page, at, go_on = text, cursor, more
        yield page
        while go_on:  # (a run deleted meanwhile reads as an empty last page)
            page, at, go_on, _ = await replay(settings, _text_page, settings, run_id, at, rank,
                                              PAGE)
            yield page

    name = f"paralab-{run_id}" + (f"-rank{rank}" if rank is not None else "") + ".log"
    return StreamingResponse(pages(), media_type="text/plain; charset=utf-8",
                             headers={"Content-Disposition": f'attachment; filename="{name}"'})
