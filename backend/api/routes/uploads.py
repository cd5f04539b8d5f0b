"""POST /api/uploads and GET /api/uploads/{sha256}: a user's working directory as an archive,
for runs of their own script (backend/services/uploads.py, docs/security.md "User code")."""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter, Request, Response
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel

from backend import permissions
from backend.api.deps import CheckedParams, DbDep, SettingsDep, UserDep
from backend.api.schemas import Sha256Path
from backend.core.db import get_sessionmaker
from backend.core.identity import client_address
from backend.services import uploads

router = APIRouter(prefix="/api/uploads", tags=["uploads"], dependencies=[CheckedParams])

BODY = {"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": {
    "type": "object", "required": ["file"], "properties": {"file": {
        "type": "string", "format": "binary",
        "description": "the working directory as a .tar.gz / .tgz / .zip"}}}}}}}


class UploadView(BaseModel):
    sha256: str
    size: int
    owner: str
    name: str
    kind: str
    file_count: int
    unpacked_bytes: int
    created_at: datetime
    entries: list[str] | None = None


def view(row, entries: bool = False) -> UploadView:
    return UploadView(sha256=row.sha256, size=row.size, owner=row.owner, name=row.name,
                      kind=row.kind, file_count=row.file_count,
                      unpacked_bytes=row.unpacked_bytes, created_at=row.created_at,
                      entries=list(row.entries) if entries else None)


@router.post("", status_code=201, response_model=UploadView, response_model_exclude_none=True,
             responses={200: {"description": "the same bytes were uploaded before: that record",
                              "model": UploadView}}, openapi_extra=BODY)
async def create_upload(request: Request, response: Response, settings: SettingsDep,
                        user: UserDep) -> UploadView:
    """Store an archive (multipart field `file`): 201 with its record, or 200 with the record
    of the same bytes uploaded before. 422 names `file` and the member that breaks a rule;
    403 for a viewer or past the upload quota. Nothing is kept from a refused upload."""
    permissions.require_submit(user)  # before a byte is read
    got = await uploads.receive(request.stream(), request.headers.get("content-type"),
                                request.headers.get("content-length"), settings)

    def keep():
        with get_sessionmaker(settings.db_url)() as db:
            row, created = uploads.store(db, settings, user, got, client_address(request))
            return view(row), created
    out, created = await run_in_threadpool(keep)
    response.status_code = 201 if created else 200
    return out


@router.get("/{sha256}", response_model=UploadView)
def get_upload(sha256: Sha256Path, db: DbDep, user: UserDep) -> UploadView:
    """An upload's record and its member paths (the first 10,000): its owner or an admin."""
    return view(uploads.get(db, user, sha256), entries=True)
