"""Run files on the backend: uploaded by workers, served to users, never outside their run.

Also what the backend knows of its storage failing: a write that ran out of space (ENOSPC,
EDQUOT; on files, or the database's "disk full") becomes InsufficientStorage (507) naming what
could not be written, and is remembered for /api/health and the reaper.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import secrets
import shutil
import time
from pathlib import Path, PurePosixPath
from urllib.parse import unquote

from backend.errors import Conflict, InsufficientStorage, UnsafePath

_SAFE_PART = re.compile(r"^[A-Za-z0-9_.\-]{1,200}$")
# resolve_run_path's rule as the OpenAPI schema states it (a regular expression of JSON
# Schema's dialect): parts of _SAFE_PART's characters joined by "/", none of them "." or "..".
_PART = r"(?:[A-Za-z0-9_-][A-Za-z0-9_.-]{0,199}|\.[A-Za-z0-9_-][A-Za-z0-9_.-]{0,198}" \
        r"|\.\.[A-Za-z0-9_.-]{1,198})"
FILE_PATH_PATTERN = f"^{_PART}(?:/{_PART})*$"
_FILE_PATH = re.compile(FILE_PATH_PATTERN.replace("$", r"\Z"))  # ($ would let a "\n" end it)
FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
# TEST-ONLY fault injection, like jobs/testbug.py: while the file this names exists, every
# write of run files and of the database raises OSError(ENOSPC), as a full disk does. Read
# here and nowhere else; never set by the service.
TEST_DISK_FULL_ENV = "PARALAB_TEST_DISK_FULL_FLAG"

# (monotonic time, what) of the last write that failed for lack of space, in this process.
last_failure: tuple[float, str] | None = None


def is_disk_full(exc: BaseException) -> bool:
    """ENOSPC / EDQUOT, also as the database reports it: SQLite's SQLITE_FULL ("database or
    disk is full"), PostgreSQL's class 53 (disk_full 53100), under SQLAlchemy's wrapper."""
    orig = getattr(exc, "orig", None) or exc
    if isinstance(orig, OSError) and orig.errno in FULL_ERRNOS:
        return True
    if getattr(orig, "sqlite_errorcode", None) == 13:  # SQLITE_FULL
        return True
    if getattr(orig, "sqlstate", None) == "53100":
        return True
    return "database or disk is full" in str(orig)


def storage_failed(what: str, data_dir: Path | None, exc: BaseException) -> InsufficientStorage:
    """The 507 for a write of `what` that ran out of space; remembered for /api/health.
    `data_dir` None: the space is not ours (the database server's)."""
    global last_failure
    orig = getattr(exc, "orig", None) or exc
    why = getattr(orig, "strerror", None) or str(orig).splitlines()[0]
    where = (f"the storage of the data directory {Path(data_dir).resolve()}" if data_dir
             else "the database server's storage")
    detail = (f"could not write {what}: no space left on {where} ({why}); free some space "
              "there (or raise the quota) and retry")
    last_failure = (time.monotonic(), detail)
    return InsufficientStorage(detail)


def recent_failure(within_s: float) -> str | None:
    """The last out-of-space write of this process, if it happened within the window."""
    if last_failure is not None and time.monotonic() - last_failure[0] < within_s:
        return last_failure[1]
    return None


def injected_full(path: Path | None = None) -> None:
    """TEST-ONLY (TEST_DISK_FULL_ENV): raise as a full disk would, writing `path`, while the
    flag file exists."""
    flag = os.environ.get(TEST_DISK_FULL_ENV)
    if flag and os.path.exists(flag):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path or flag))


def _before_write(conn, cursor, statement, params, context, executemany):
    """The error each database driver raises when its disk is full."""
    if statement.lstrip()[:6].upper() not in ("INSERT", "UPDATE", "DELETE"):
        return
    try:
        injected_full()
    except OSError:
        if conn.dialect.name == "sqlite":
            import sqlite3
            raise sqlite3.OperationalError("database or disk is full") from None
        import psycopg.errors
        raise psycopg.errors.DiskFull("could not extend file: No space left on device") \
            from None


def install_test_faults(engine) -> None:
    """Under TEST_DISK_FULL_ENV only: the database's writes fail while the flag file exists."""
    if not os.environ.get(TEST_DISK_FULL_ENV):
        return
    from sqlalchemy import event
    if not event.contains(engine, "before_cursor_execute", _before_write):
        event.listen(engine, "before_cursor_execute", _before_write)


def resolve_run_path(runs_dir: Path, run_id: str, rel: str) -> Path:
    """Map a user-supplied relative path to a file inside the run's folder, or UnsafePath
    (a ValueError too).

    Rejects absolute paths, `..`, encoded variants (decoded repeatedly first), backslashes and
    any part outside [A-Za-z0-9_.-]; the resolved path must still be under the run folder.
    """
    decoded = rel
    for _ in range(3):
        decoded = unquote(decoded)
    if "\\" in decoded or "\x00" in decoded:
        raise UnsafePath("path: backslashes and NUL are not allowed")
    p = PurePosixPath(decoded)
    if p.is_absolute() or not p.parts:
        raise UnsafePath("path: must be relative to the run's folder")
    for part in p.parts:
        if part in ("..", ".") or not _SAFE_PART.match(part):
            raise UnsafePath(f"path: part {part!r} is not allowed "
                             "(letters, digits, '_', '-', '.'; no '..')")
    if not _FILE_PATH.match(rel):  # what the schema states: no empty part, no encoding
        raise UnsafePath("path: must be parts of letters, digits, '_', '-', '.' joined by "
                         "'/' (no empty part, no '.' or '..' part, nothing %-encoded)")
    base = (runs_dir / run_id).resolve()
    target = (base / Path(*p.parts)).resolve()
    if base not in target.parents:
        raise UnsafePath("path: escapes the run's folder")
    return target


class PartFile:
    """A run file written chunk by chunk as its bytes arrive, under a temporary name beside
    `target`, and renamed into place by `commit` only once whole: a refused or interrupted
    write (`discard`) leaves nothing at `target`, and a file already there stays as it was
    until the new one is complete. The temporary name is hidden and unique per write
    (`.NAME.<random>.part`, never recorded as a run file), so a retried upload
    racing the one it replaces never shares or removes the other's file."""

    TMP_NAME = re.compile(r"^\..+\.[0-9a-f]{12}\.part$")  # what __init__ names (the sweep's)

    def __init__(self, target: Path):
        injected_full(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        self.target, self.size, self._hash = target, 0, hashlib.sha256()
        # ("x": a fresh file, made with the umask's mode as the run's other files are)
        self.tmp = target.with_name(f".{target.name}.{secrets.token_hex(6)}.part")
        self._f = open(self.tmp, "xb")

    def write(self, chunks) -> None:
        try:
            injected_full(self.target)  # (a real disk fills up mid-file, not only at the start)
            for chunk in chunks:
                self._f.write(chunk)
                self._hash.update(chunk)
                self.size += len(chunk)
        except OSError:  # disk full: no half file left behind to fill it further
            self.discard()
            raise

    def commit(self) -> tuple[int, str]:
        """Rename the whole file into place; its (size, sha256)."""
        try:
            self._f.close()
            self.tmp.replace(self.target)
        except OSError:
            self.discard()
            raise
        return self.size, self._hash.hexdigest()

    def discard(self) -> None:
        self._f.close()
        self.tmp.unlink(missing_ok=True)


_UPLOAD_TMP = re.compile(r"^\.tmp-[0-9a-f]{16}$")  # services/uploads.receive's
_IMPORT_STAGE = re.compile(r"^body-[0-9a-f]{16}$")  # services/imports' staging folders
LEFTOVER_AGE_S = 3600.0


def sweep_leftovers(settings, older_than_s: float = LEFTOVER_AGE_S,
                    now: float | None = None) -> list[Path]:
    """Remove what a killed API process left half-written: PartFile's hidden run files, an
    upload's temporary file, an import's staging folder. Only those older than
    `older_than_s` (by mtime): another API process may be writing a younger one right now.
    Run once at startup (backend.main's lifespan, in a thread); returns what it removed."""
    now = time.time() if now is None else now
    gone: list[Path] = []

    def old(p: Path) -> bool:
        try:
            return now - p.lstat().st_mtime > older_than_s
        except OSError:
            return False
    for top, pattern in ((settings.runs_dir, PartFile.TMP_NAME),
                         (settings.uploads_dir, _UPLOAD_TMP)):
        for root, _dirs, files in os.walk(top):
            for name in files:
                p = Path(root) / name
                if pattern.match(name) and old(p):
                    p.unlink(missing_ok=True)
                    gone.append(p)
    imports = settings.data_dir.resolve() / "imports"
    if imports.is_dir():
        for p in imports.iterdir():
            if _IMPORT_STAGE.match(p.name) and p.is_dir() and old(p):
                shutil.rmtree(p, ignore_errors=True)
                gone.append(p)
    return gone


def seal_live(target: Path, size: int) -> str:
    """A live file (appended chunk by chunk while its job ran) now complete at `size`
    bytes: its sha256, read here from disk, so the whole file is not sent a second time.
    Conflict (409) when this copy is not that size (a chunk was lost: send it whole)."""
    have = target.stat().st_size if target.is_file() else None
    if have != size:
        raise Conflict(f"size: the live copy holds {have if have is not None else 'no'} bytes, "
                       f"not {size}: upload the whole file")
    h = hashlib.sha256()
    with open(target, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def append_at(target: Path, offset: int, data: bytes) -> int:
    """Write `data` at byte `offset` of a growing live file (a worker's trace while the job
    runs) and cut what follows, so a retried chunk is harmless; return the new size. An offset
    past the end is a gap the sender must fill first: Conflict (409)."""
    injected_full(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    size = target.stat().st_size if target.exists() else 0
    if offset > size:
        raise Conflict(f"offset: {offset} is past the end of the live file ({size} bytes)")
    with open(target, "r+b" if target.exists() else "wb") as f:
        f.seek(offset)
        f.write(data)
        f.truncate()
    return offset + len(data)
