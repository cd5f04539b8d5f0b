"""POST /api/imports: profiler traces made elsewhere become a run (backend/services/imports.py,
docs/imports.md). The run is then read like any other: GET /api/runs/{id}, its analysis, Gantt,
exports and compare."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool

from backend import permissions
from backend.api.deps import SettingsDep, UserDep
from backend.api.routes.runs.crud import RunView, view
from backend.core.db import get_sessionmaker
from backend.core.identity import client_address
from backend.services import imports

router = APIRouter(prefix="/api/imports", tags=["imports"])

# The form, as stated: the body is parsed here as it streams in (imports.receive), not by
# FastAPI, which would spool every file before the handler could hold it to the limit.
BODY = {"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": {
    "type": "object", "required": ["files", "name"], "title": "Body_create_import",
    "properties": {
        "files": {"type": "array", "minItems": 1, "title": "Files",
                  "items": {"type": "string", "contentMediaType": "application/octet-stream"},
                  "description": (
                      "per-rank PyTorch profiler traces (.json / .json.gz, one per rank, each "
                      "naming its rank and world size in distributedInfo), or one .zip / "
                      ".tar.gz of a trace folder (as torch.profiler.tensorboard_trace_handler "
                      "writes it)")},
        "name": {"type": "string", "minLength": 1, "maxLength": 200, "title": "Name",
                 "description": "the run's name"},
        "tags": {"type": "array", "items": {"type": "string"}, "title": "Tags",
                 "description": "tags (repeat the field)", "default": []},
        "notes": {"type": "string", "title": "Notes", "description": "notes (Markdown)",
                  "default": ""},
        "allow_missing_ranks": {
            "type": "boolean", "title": "Allow Missing Ranks", "default": False,
            "description": "analyse the ranks given although the traces' world size names "
                           "more"}}}}}}}


@router.post("", status_code=201, response_model=RunView, openapi_extra=BODY)
async def create_import(request: Request, settings: SettingsDep, user: UserDep) -> RunView:
    """Create a run of kind `import` from Kineto traces: checked (one file per rank, one world
    size, every rank unless allow_missing_ranks), converted into paralab's trace schema and
    analysed by the one analysis engine, plus HTA's GPU figures (analysis `kineto`). 422 names
    the file (and the byte where a parse failed); nothing is stored then."""
    permissions.require_submit(user)  # before a byte is read
    body = await imports.receive(request.stream(), request.headers.get("content-type"),
                                 request.headers.get("content-length"), settings)

    def keep():
        with get_sessionmaker(settings.db_url)() as db:
            run = imports.create(db, settings, user, body, client=client_address(request))
            return view(db, user, run, starred=set())
    return await run_in_threadpool(keep)
