"""Run files on the backend: uploaded by workers, served to users, never outside their run."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path, PurePosixPath
from urllib.parse import unquote

from backend.errors import Conflict, UnsafePath

_SAFE_PART = re.compile(r"^[A-Za-z0-9_.\-]{1,200}$")


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
    base = (runs_dir / run_id).resolve()
    target = (base / Path(*p.parts)).resolve()
    if base not in target.parents:
        raise UnsafePath("path: escapes the run's folder")
    return target


def save_stream(target: Path, chunks) -> tuple[int, str]:
    """Write chunks to target atomically; return (size, sha256)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".part")
    h, size = hashlib.sha256(), 0
    with open(tmp, "wb") as f:
        for chunk in chunks:
            f.write(chunk)
            h.update(chunk)
            size += len(chunk)
    tmp.replace(target)
    return size, h.hexdigest()


def append_at(target: Path, offset: int, data: bytes) -> int:
    """Write `data` at byte `offset` of a growing live file (a worker's trace while the job
    runs) and cut what follows, so a retried chunk is harmless; return the new size. An offset
    past the end is a gap the sender must fill first: Conflict (409)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    size = target.stat().st_size if target.exists() else 0
    if offset > size:
        raise Conflict(f"offset: {offset} is past the end of the live file ({size} bytes)")
    with open(target, "r+b" if target.exists() else "wb") as f:
        f.seek(offset)
        f.write(data)
        f.truncate()
    return offset + len(data)
