"""The worker channel: how workers on other hosts report back without touching the database
or sharing a filesystem. Every call carries the worker credential and is idempotent, so a
worker may retry any of them after a timeout or a backend restart.

Served ahead of browsers (backend/api/threads.py): the routes are async with async
dependencies only, and do their work in a thread of the channel's own capacity, so browser
pages and streams holding every thread of FastAPI's shared pool never delay a log batch or a
heartbeat."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, BackgroundTasks, Depends, Header, Query, Request
from fastapi.responses import FileResponse

from backend import crud
from backend.api.deps import check_params, get_run_or_404, require_worker
from backend.api.schemas import (
    FILE_RESPONSES,
    INT64_MAX,
    ClaimIn,
    FinishIn,
    LogBatch,
    LogBatchOut,
    RunFilePath,
    Sha256Path,
    WorkerIn,
)
from backend.api.threads import on_channel
from backend.core.config import Settings
from backend.core.db import get_sessionmaker
from backend.errors import NotFound
from backend.services import run_traces, uploads
from backend.storage import PartFile, append_at, resolve_run_path, seal_live
from backend.streams import hub
from jobs.ckpt_index import complete_checkpoints


# The shared dependencies' rules, as coroutines: FastAPI runs a plain function dependency in
# its shared thread pool, which is what the channel must not wait for.
async def _checked_params(request: Request) -> None:
    check_params(request)


async def _settings(request: Request) -> Settings:
    return request.app.state.settings


async def _worker(request: Request,
                  authorization: Annotated[str | None, Header()] = None) -> str:
    return require_worker(request, authorization)


ChannelChecks = Depends(_checked_params)
ChannelSettings = Annotated[Settings, Depends(_settings)]
ChannelWorker = Annotated[str, Depends(_worker)]
router = APIRouter(prefix="/api/internal", tags=["worker channel"], dependencies=[ChannelChecks])


async def in_channel(settings: Settings, run_id: str | None, fn: Callable[..., Any],
                     *args) -> Any:
    """`fn(db, run, *args)` (`fn(db, *args)` without a run) with a session of its own, in a
    thread of the worker channel's capacity; an unknown run is a 404."""
    def work():
        with get_sessionmaker(settings.db_url)() as db:
            if run_id is None:
                return fn(db, *args)
            return fn(db, get_run_or_404(run_id, db), *args)
    return await on_channel(settings, work)


def log_answer(added: int, problems: list) -> dict:
    """LogBatchOut of crud.append_logs' count and problems: each names the line's field."""
    return {"added": added, "rejected": [
        {"loc": ["body", "lines", i, field], "msg": msg} for i, field, msg in problems] or None}


def _claim(db, run, body: ClaimIn) -> dict:
    ok, reason = crud.claim(db, run.id, worker=body.worker, task_id=body.task_id)
    if ok:
        hub.publish_status(run.id, "running")
    return {"launch": ok, "reason": reason, "spec": run.spec if ok else None}


@router.post("/runs/{run_id}/claim")
async def claim(run_id: str, body: ClaimIn, settings: ChannelSettings,
                _: ChannelWorker) -> dict:
    return await in_channel(settings, run_id, _claim, body)


def _heartbeat(db, run) -> dict:
    run = crud.heartbeat(db, run.id)
    return {"status": run.status, "cancel": run.cancel_requested}


@router.post("/runs/{run_id}/heartbeat")
async def heartbeat(run_id: str, settings: ChannelSettings, _: ChannelWorker) -> dict:
    return await in_channel(settings, run_id, _heartbeat)


def _logs(db, run, body: LogBatch) -> dict:
    new, problems = [], []
    added = crud.append_logs(db, run.id, [x.model_dump() for x in body.lines], out=new,
                             problems=problems)
    hub.publish_lines(run.id, sorted(new))  # after the commit: see backend/streams.py
    return log_answer(added, problems)


@router.post("/runs/{run_id}/logs", response_model=LogBatchOut, response_model_exclude_none=True)
async def logs(run_id: str, body: LogBatch, settings: ChannelSettings,
               _: ChannelWorker) -> dict:
    """A batch of the run's numbered lines (idempotent on seq). A line that cannot be stored
    as sent (a time outside what the databases hold) is stored as well as it can be and named
    in `rejected`; a rank prefix past 32 bits is no rank (the line is stored without one)."""
    return await in_channel(settings, run_id, _logs, body)


WRITE_BATCH = 1 << 20  # bytes held before a write: one thread hop per MiB, not per chunk


async def save_body(settings: Settings, target: Path,
                    stream: AsyncIterator[bytes]) -> tuple[int, str]:
    """A whole file's body written to disk as it arrives (at most WRITE_BATCH of it in
    memory), renamed into place once complete (storage.PartFile): a body cut off, or a write
    refused (disk full: 507), leaves nothing at `target`. (size, sha256)."""
    part = await on_channel(settings, PartFile, target)
    try:
        batch: list[bytes] = []
        held = 0
        async for chunk in stream:
            batch.append(chunk)
            held += len(chunk)
            if held >= WRITE_BATCH:
                await on_channel(settings, part.write, batch)
                batch, held = [], 0
        await on_channel(settings, part.write, batch)
        return await on_channel(settings, part.commit)
    except BaseException:
        # shielded: a cancelled request (the client went away) must still remove its file
        with anyio.CancelScope(shield=True):
            await on_channel(settings, part.discard)
        raise


@router.put("/runs/{run_id}/files/{path:path}")
async def upload(request: Request, run_id: str, settings: ChannelSettings, path: RunFilePath,
                 _: ChannelWorker, offset: int | None = Query(None, ge=0, le=INT64_MAX)) -> dict:
    """The whole file (after the run), or with `offset` a live chunk of a growing trace:
    written in place, not recorded as a run file, and announced to the run's open streams."""
    run_id = await in_channel(settings, run_id, lambda db, run: run.id)  # 404 first
    target = resolve_run_path(settings.runs_dir, run_id, path)  # UnsafePath: 400
    if offset is not None:  # a live chunk: bounded by the worker (worker/live.py MAX_CHUNK)
        size = await on_channel(settings, append_at, target, offset, await request.body())
        hub.publish_event(run_id)  # (append_at: a gap is a Conflict)
        return {"path": path, "size": size}
    size, sha = await save_body(settings, target, request.stream())
    await in_channel(settings, None, crud.record_file, run_id, path, size, sha)
    return {"path": path, "size": size, "sha256": sha}


@router.post("/runs/{run_id}/sealed-files/{path:path}")
async def seal(run_id: str, settings: ChannelSettings, path: RunFilePath, _: ChannelWorker,
               size: int = Query(..., ge=0, le=INT64_MAX)) -> dict:
    """A trace file shipped live (PUT with `offset`) is complete at `size` bytes: recorded as
    a run file from the copy here, its bytes not uploaded again (409 when this copy is not
    that size: the worker then uploads it whole)."""
    run_id = await in_channel(settings, run_id, lambda db, run: run.id)  # 404 first
    target = resolve_run_path(settings.runs_dir, run_id, path)  # UnsafePath: 400
    sha = await on_channel(settings, seal_live, target, size)
    await in_channel(settings, None, crud.record_file, run_id, path, size, sha)
    return {"path": path, "size": size, "sha256": sha}


def _checkpoint_files(db, run, settings: Settings, step: int) -> dict:
    base = settings.runs_dir / run.id
    found = [c for c in complete_checkpoints(base) if c["step"] == step]
    if not found:
        raise NotFound(f"run {run.id} has no complete checkpoint at step {step}")
    folder = Path(found[0]["path"])
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    return {"step": step, "folder": folder.relative_to(base).as_posix(),
            "files": [{"path": p.relative_to(base).as_posix(), "size": p.stat().st_size}
                      for p in files]}


@router.get("/runs/{run_id}/checkpoints/{step}/files")
async def checkpoint_files(run_id: str, settings: ChannelSettings, step: int,
                           _: ChannelWorker) -> dict:
    """What a worker downloads to resume from this run's complete checkpoint at `step`:
    the checkpoint folder's files, relative to the run's storage."""
    return await in_channel(settings, run_id, _checkpoint_files, settings, step)


def _download_target(db, run, settings: Settings, path: str) -> Path:
    target = resolve_run_path(settings.runs_dir, run.id, path)  # UnsafePath: 400
    if not target.is_file():
        raise NotFound(f"no file {path!r} in run {run.id}")
    return target


@router.get("/runs/{run_id}/files/{path:path}", response_class=FileResponse,
            responses=FILE_RESPONSES)
async def download(run_id: str, settings: ChannelSettings, path: RunFilePath,
                   _: ChannelWorker) -> FileResponse:
    return FileResponse(await in_channel(settings, run_id, _download_target, settings, path))


@router.get("/uploads/{sha256}", response_class=FileResponse, responses=FILE_RESPONSES)
async def upload_archive(sha256: Sha256Path, settings: ChannelSettings,
                         _: ChannelWorker) -> FileResponse:
    """An uploaded working directory's archive (the record's kind names its format), for the
    worker that unpacks it for a run (paralab_core.archives.unpack)."""
    path = await in_channel(settings, None, uploads.archive_path, settings, sha256)
    return FileResponse(path, media_type="application/octet-stream", filename=path.name)


def _finish(db, run, body: FinishIn) -> dict:
    run = crud.finish(db, run.id, status=body.status, exit_code=body.exit_code, error=body.error,
                      summary=body.summary, provenance=body.provenance)
    hub.publish_status(run.id, run.status)
    return {"status": run.status}


@router.post("/runs/{run_id}/finish")
async def finish(run_id: str, body: FinishIn, _: ChannelWorker, settings: ChannelSettings,
                 background: BackgroundTasks) -> dict:
    out = await in_channel(settings, run_id, _finish, body)
    if body.summary is not None:  # the files are uploaded: parse the trace before anyone asks
        background.add_task(run_traces.warm, settings.runs_dir / run_id)
    return out


def _worker_heartbeat(db, body: WorkerIn) -> dict:
    crud.upsert_worker(db, **body.model_dump())
    return {"ok": True}


@router.post("/workers/heartbeat")
async def worker_heartbeat(body: WorkerIn, _: ChannelWorker, settings: ChannelSettings) -> dict:
    return await in_channel(settings, None, _worker_heartbeat, body)
