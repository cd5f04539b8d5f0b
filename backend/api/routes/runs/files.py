"""A run's files: the list, and one file (never a path outside the run's folder)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import FileResponse

from backend import crud
from backend.api.deps import DbDep, RunDep, SettingsDep
from backend.api.schemas import FILE_RESPONSES, FileOut, RunFilePath
from backend.errors import NotFound
from backend.storage import resolve_run_path

router = APIRouter(prefix="/api/runs", tags=["runs"])


@router.get("/{run_id}/files", response_model=list[FileOut])
def list_files(db: DbDep, run: RunDep) -> list[FileOut]:
    return [FileOut(path=f.path, size=f.size, sha256=f.sha256, created_at=f.created_at)
            for f in crud.list_files(db, run.id)]


@router.get("/{run_id}/files/{path:path}", response_class=FileResponse,
            responses=FILE_RESPONSES)
def download_file(run: RunDep, settings: SettingsDep, path: RunFilePath) -> FileResponse:
    target = resolve_run_path(settings.runs_dir, run.id, path)  # UnsafePath: 400
    if not target.is_file():
        raise NotFound(f"no file {path!r} in run {run.id}")
    return FileResponse(target, filename=target.name)
