"""A run's log as text (its live stream: streams.py)."""

from __future__ import annotations

from fastapi import APIRouter, Query
from fastapi.responses import PlainTextResponse

from backend import crud
from backend.api.deps import DbDep, RunDep
from backend.api.schemas import INT32_MAX

router = APIRouter(prefix="/api/runs", tags=["runs"])


@router.get("/{run_id}/logs", response_class=PlainTextResponse)
def get_logs(db: DbDep, run: RunDep, rank: int | None = Query(None, ge=0, le=INT32_MAX),
             after: int = Query(-1, ge=-1, le=INT32_MAX)) -> str:
    # (rank and seq are INTEGER columns: a larger bound would overflow the query)
    lines: list[str] = []
    while True:
        batch = crud.logs_after(db, run.id, after, rank=rank, limit=5000)
        lines += [x.line for x in batch]
        if len(batch) < 5000:
            break
        after = batch[-1].seq
    return "\n".join(lines) + ("\n" if lines else "")
