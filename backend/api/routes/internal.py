"""The worker channel: how workers on other hosts report back without touching the database
or sharing a filesystem. Every call carries the worker credential and is idempotent, so a
worker may retry any of them after a timeout or a backend restart."""

from __future__ import annotations

from fastapi import APIRouter, BackgroundTasks, Query, Request
from starlette.concurrency import run_in_threadpool

from backend import crud, run_traces
from backend.api.deps import CheckedParams, DbDep, RunDep, SettingsDep, WorkerDep
from backend.api.schemas import INT64_MAX, ClaimIn, FinishIn, LogBatch, WorkerIn
from backend.core.db import get_sessionmaker
from backend.storage import append_at, resolve_run_path, save_stream
from backend.streams import hub

router = APIRouter(prefix="/api/internal", tags=["worker channel"], dependencies=[CheckedParams])


@router.post("/runs/{run_id}/claim")
def claim(db: DbDep, run: RunDep, body: ClaimIn, _: WorkerDep) -> dict:
    ok, reason = crud.claim(db, run.id, worker=body.worker, task_id=body.task_id)
    if ok:
        hub.publish_status(run.id, "running")
    return {"launch": ok, "reason": reason, "spec": run.spec if ok else None}


@router.post("/runs/{run_id}/heartbeat")
def heartbeat(db: DbDep, run: RunDep, _: WorkerDep) -> dict:
    run = crud.heartbeat(db, run.id)
    return {"status": run.status, "cancel": run.cancel_requested}


@router.post("/runs/{run_id}/logs")
def logs(db: DbDep, run: RunDep, body: LogBatch, _: WorkerDep) -> dict:
    new: list = []
    added = crud.append_logs(db, run.id, [x.model_dump() for x in body.lines], out=new)
    hub.publish_lines(run.id, sorted(new))  # after the commit: see backend/streams.py
    return {"added": added}


@router.put("/runs/{run_id}/files/{path:path}")
async def upload(request: Request, run: RunDep, settings: SettingsDep, path: str,
                 _: WorkerDep, offset: int | None = Query(None, ge=0, le=INT64_MAX)) -> dict:
    """The whole file (after the run), or with `offset` a live chunk of a growing trace:
    written in place, not recorded as a run file, and announced to the run's open streams."""
    target = resolve_run_path(settings.runs_dir, run.id, path)  # UnsafePath: 400
    chunks = [c async for c in request.stream()]
    if offset is not None:
        size = await run_in_threadpool(append_at, target, offset, b"".join(chunks))  # Conflict
        hub.publish_event(run.id)
        return {"path": path, "size": size}
    size, sha = await run_in_threadpool(save_stream, target, chunks)

    def record():
        with get_sessionmaker(settings.db_url)() as db:
            crud.record_file(db, run.id, path, size, sha)
    await run_in_threadpool(record)
    return {"path": path, "size": size, "sha256": sha}


@router.post("/runs/{run_id}/finish")
def finish(db: DbDep, run: RunDep, body: FinishIn, _: WorkerDep, settings: SettingsDep,
           background: BackgroundTasks) -> dict:
    run = crud.finish(db, run.id, status=body.status, exit_code=body.exit_code, error=body.error,
                      summary=body.summary, provenance=body.provenance)
    hub.publish_status(run.id, run.status)
    if body.summary is not None:  # the files are uploaded: parse the trace before anyone asks
        background.add_task(run_traces.warm, settings.runs_dir / run.id)
    return {"status": run.status}


@router.post("/workers/heartbeat")
def worker_heartbeat(db: DbDep, body: WorkerIn, _: WorkerDep) -> dict:
    crud.upsert_worker(db, **body.model_dump())
    return {"ok": True}
