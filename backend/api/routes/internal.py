"""The worker channel: how workers on other hosts report back without touching the database
or sharing a filesystem. Every call carries the worker credential and is idempotent, so a
worker may retry any of them after a timeout or a backend restart."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, BackgroundTasks, Query, Request
from fastapi.responses import FileResponse
from starlette.concurrency import run_in_threadpool

from backend import crud, run_traces
from backend.api.deps import CheckedParams, DbDep, RunDep, SettingsDep, WorkerDep
from backend.api.schemas import INT64_MAX, ClaimIn, FinishIn, LogBatch, WorkerIn
from backend.core.db import get_sessionmaker
from backend.errors import NotFound
from backend.storage import append_at, resolve_run_path, save_stream
from backend.streams import hub
from jobs.ckpt_index import complete_checkpoints

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


@router.get("/runs/{run_id}/checkpoints/{step}/files")
def checkpoint_files(run: RunDep, settings: SettingsDep, step: int, _: WorkerDep) -> dict:
    """What a worker downloads to resume from this run's complete checkpoint at `step`:
    the checkpoint folder's files, relative to the run's storage."""
    base = settings.runs_dir / run.id
    found = [c for c in complete_checkpoints(base) if c["step"] == step]
    if not found:
        raise NotFound(f"run {run.id} has no complete checkpoint at step {step}")
    folder = Path(found[0]["path"])
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    return {"step": step, "folder": folder.relative_to(base).as_posix(),
            "files": [{"path": p.relative_to(base).as_posix(), "size": p.stat().st_size}
                      for p in files]}


@router.get("/runs/{run_id}/files/{path:path}")
def download(run: RunDep, settings: SettingsDep, path: str, _: WorkerDep) -> FileResponse:
    target = resolve_run_path(settings.runs_dir, run.id, path)  # UnsafePath: 400
    if not target.is_file():
        raise NotFound(f"no file {path!r} in run {run.id}")
    return FileResponse(target)


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
