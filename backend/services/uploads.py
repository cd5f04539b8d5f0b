"""Uploads of a user's working directory (a .tar.gz / .tgz / .zip), for runs of their own
script (docs/security.md "User code").

The multipart body is parsed as it arrives and the `file` part streamed to a temporary file
under DATA_DIR/uploads while it is hashed, so an upload over PARALAB_UPLOAD_MAX_MB is refused
after at most that many bytes, and nothing is spooled elsewhere. The archive is then inspected
member by member (paralab_core.archives: paths, links, devices, counts, unpacked size), held to
the owner's quota (PARALAB_UPLOAD_QUOTA_MB over the uploads they own) and moved to
DATA_DIR/uploads/<sha256>.<kind>: content-addressed, so the same bytes uploaded again are the
existing record. A refusal is a 422 naming `file` and the member; the temporary file is gone.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header
from sqlalchemy.orm import Session

from backend import crud, permissions
from backend.core.config import Settings
from backend.core.identity import Principal
from backend.errors import Forbidden, Invalid, NotFound
from backend.models import Upload
from backend.services.multipart import StreamedParts
from paralab_core import archives

ENTRIES_KEPT = 10_000  # member paths stored with the record (the file count is exact)
SLACK = 64 << 10  # multipart framing and headers beyond the file's own bytes


def bad(msg: str) -> Invalid:
    return Invalid(f"file: {msg}", field="file")


@dataclass
class Received:
    """The `file` part as written to `path`: its name as sent, size and sha256."""

    path: Path
    name: str = ""
    size: int = 0
    sha256: str = ""
    _hash: object = field(default_factory=hashlib.sha256, repr=False)


class _Parts(StreamedParts):
    """Callbacks of python-multipart's streaming parser: the `file` part goes to disk."""

    def __init__(self, dest: Path, limit: int):
        self.dest, self.limit = dest, limit
        self.got = Received(dest)
        self.fh = None
        super().__init__()
        self.files = 0

    def started(self, opts: dict) -> None:
        if opts.get(b"name") != b"file":
            return
        self.files += 1
        if self.files > 1:
            raise bad("give one archive (one `file` part)")
        name = opts.get(b"filename", b"").decode("utf-8", "replace")  # only ever shown
        self.got.name = "".join(c for c in name if c.isprintable())[:200]
        self.fh = open(self.dest, "xb")

    def data(self, data, start, end):
        if self.fh is None:
            return
        chunk = data[start:end]
        self.got.size += len(chunk)
        if self.got.size > self.limit:
            raise bad(f"{self.got.name or 'the archive'}: over the upload limit of "
                      f"{self.limit:,} bytes (PARALAB_UPLOAD_MAX_MB)")
        self.got._hash.update(chunk)
        self.fh.write(chunk)

    def end(self):
        if self.fh is not None:
            self.fh.close()
            self.fh = None


async def receive(chunks: AsyncIterator[bytes], content_type: str | None,
                  content_length: str | None, settings: Settings) -> Received:
    """Stream the body's `file` part to a temporary file under DATA_DIR/uploads (removed on
    any refusal)."""
    limit = settings.upload_max_mb << 20
    ctype, opts = parse_options_header(content_type or "")
    boundary = opts.get(b"boundary")
    if ctype != b"multipart/form-data" or not boundary:
        raise bad("send the archive as multipart/form-data, in the field `file`")
    if content_length and content_length.isdigit() and int(content_length) > limit + SLACK:
        raise bad(f"the body ({int(content_length):,} bytes) is over the upload limit of "
                  f"{limit:,} bytes (PARALAB_UPLOAD_MAX_MB)")
    settings.uploads_dir.mkdir(parents=True, exist_ok=True)
    tmp = settings.uploads_dir / f".tmp-{secrets.token_hex(8)}"
    parts = _Parts(tmp, limit)
    parser = MultipartParser(boundary, parts.callbacks())
    try:
        async for chunk in chunks:  # disk writes off the event loop
            await asyncio.to_thread(parser.write, chunk)
        parser.finalize()
        if parts.files == 0:
            raise bad("no `file` part in the body: give the archive (.tar.gz, .tgz or .zip)")
        if parts.fh is not None:
            raise bad("the body ended inside the `file` part")
    except MultipartParseError as exc:
        parts.end()
        tmp.unlink(missing_ok=True)
        raise bad(f"the multipart body could not be read ({exc})") from None
    except BaseException:
        parts.end()
        tmp.unlink(missing_ok=True)
        raise
    parts.got.sha256 = parts.got._hash.hexdigest()
    return parts.got


def path_of(settings: Settings, row: Upload) -> Path:
    return settings.uploads_dir / f"{row.sha256}.{row.kind}"


def store(db: Session, settings: Settings, user: Principal, got: Received,
          client: str | None = None) -> tuple[Upload, bool]:
    """Inspect, check the quota, keep: (the record, True when created now). The temporary
    file is moved or removed whatever happens."""
    try:
        permissions.require_submit(user)
        existing = crud.get_upload(db, got.sha256)
        if existing is not None and path_of(settings, existing).is_file():
            return existing, False
        try:
            kind = archives.kind_of(got.path)
            entries = archives.inspect(got.path, settings.archive_limits)
        except ValueError as exc:
            raise bad(f"{got.name or 'the archive'}: {exc}") from None
        quota = settings.upload_quota_mb << 20
        used = crud.uploaded_bytes(db, user.username)
        if existing is None and used + got.size > quota:
            raise Forbidden(f"upload quota: {user.username}'s uploads take {used:,} bytes; "
                            f"this one ({got.size:,}) would pass the {quota:,} allowed "
                            "(PARALAB_UPLOAD_QUOTA_MB)")
        final = settings.uploads_dir / f"{got.sha256}.{kind}"
        os.replace(got.path, final)
    finally:
        got.path.unlink(missing_ok=True)
    if existing is not None:  # its file had gone: restored from these same bytes
        return existing, False
    try:
        row, created = crud.create_upload(
            db, sha256=got.sha256, size=got.size, owner=user.username, name=got.name,
            kind=kind, file_count=len(entries),
            unpacked_bytes=sum(e["size"] for e in entries),
            entries=[e["path"] for e in entries[:ENTRIES_KEPT]])
    except Exception:
        db.rollback()
        if crud.get_upload(db, got.sha256) is None:
            final.unlink(missing_ok=True)
        raise
    if created:
        crud.audit(db, user.username, "upload.create", got.sha256,
                   {"name": row.name, "size": row.size, "files": row.file_count}, client)
    return row, created


def check_sha(sha256: str) -> str:
    if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
        raise Invalid("sha256: 64 lower-case hexadecimal digits", field="sha256", where="path")
    return sha256


def get(db: Session, user: Principal, sha256: str) -> Upload:
    """The record, for its owner or an admin."""
    row = crud.get_upload(db, check_sha(sha256))
    if row is None or not (row.owner == user.username or permissions.at_least(user, "admin")):
        raise NotFound(f"no upload {sha256}")
    return row


def archive_path(db: Session, settings: Settings, sha256: str) -> Path:
    """The stored archive (the worker channel serves it)."""
    row = crud.get_upload(db, check_sha(sha256))
    path = path_of(settings, row) if row is not None else None
    if path is None or not path.is_file():
        raise NotFound(f"no upload {sha256}")
    return path


def script_errors(db: Session, spec) -> list[dict]:
    """A script run's 422 entries past the spec's own: its upload must exist, and a file
    entry must be one of the upload's files. Any member who may submit may name an upload by
    its SHA-256: the same bytes uploaded twice are one record (the first uploader owns it),
    and knowing the hash of a content is as good as holding it."""
    if spec.kind != "script":
        return []
    sc, errors = spec.script, []
    module = sc.entry.startswith("-m ")
    if not sc.upload:
        if not module:
            errors.append({"loc": ["body", "script", "upload"], "type": "value_error",
                           "msg": f"entry {sc.entry!r} is a file: upload its working "
                                  "directory first (POST /api/uploads) and give its sha256"})
        return errors
    row = crud.get_upload(db, sc.upload)
    if row is None:
        return [{"loc": ["body", "script", "upload"], "type": "value_error",
                 "msg": f"no upload {sc.upload} (POST /api/uploads returns the sha256)"}]
    files = set(row.entries or [])
    if not module and sc.entry not in files and row.file_count <= len(files):
        shown = ", ".join(sorted(p for p in files if p.endswith(".py"))[:8]) or "none"
        errors.append({"loc": ["body", "script", "entry"], "type": "value_error",
                       "msg": f"{sc.entry} is not a file of upload {sc.upload[:12]} "
                              f"({row.name}; its .py files: {shown})"})
    return errors
