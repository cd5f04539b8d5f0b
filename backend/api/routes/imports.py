"""POST /api/imports: profiler traces made elsewhere become a run (backend/services/imports.py,
docs/imports.md). The run is then read like any other: GET /api/runs/{id}, its analysis, Gantt,
exports and compare."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, File, Form, Request, UploadFile

from backend.api.deps import DbDep, SettingsDep, UserDep
from backend.api.routes.runs.crud import RunView, view
from backend.core.identity import client_address
from backend.services import imports

router = APIRouter(prefix="/api/imports", tags=["imports"])


@router.post("", status_code=201, response_model=RunView)
def create_import(
    request: Request, db: DbDep, settings: SettingsDep, user: UserDep,
    files: Annotated[list[UploadFile], File(min_length=1, description=(
        "per-rank PyTorch profiler traces (.json / .json.gz, one per rank, each naming its rank "
        "and world size in distributedInfo), or one .zip / .tar.gz of a trace folder (as "
        "torch.profiler.tensorboard_trace_handler writes it)"))],
    name: Annotated[str, Form(min_length=1, max_length=200, description="the run's name")],
    tags: Annotated[list[str], Form(description="tags (repeat the field)")] = [],  # noqa: B006
    notes: Annotated[str, Form(description="notes (Markdown)")] = "",
    allow_missing_ranks: Annotated[bool, Form(description=(
        "analyse the ranks given although the traces' world size names more"))] = False,
) -> RunView:
    """Create a run of kind `import` from Kineto traces: checked (one file per rank, one world
    size, every rank unless allow_missing_ranks), converted into paralab's trace schema and
    analysed by the one analysis engine, plus HTA's GPU figures (analysis `kineto`). 422 names
    the file (and the byte where a parse failed); nothing is stored then."""
    run = imports.create(db, settings, user, name=name, tags=tags, notes=notes,
                         uploads=[(f.filename or "", f.file) for f in files],
                         allow_missing_ranks=allow_missing_ranks,
                         client=client_address(request))
    return view(db, user, run, starred=set())
