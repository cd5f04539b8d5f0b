"""Import runs: PyTorch profiler (Kineto) traces made elsewhere become a run of kind `import`
(docs/imports.md). The uploaded files are staged under the data directory, archives unpacked
by member (a member's name is only ever shown, never used as a path), checked and analysed by
jobs/kineto/imports.py, then moved into the run's folder and stored with the run in one
transaction: a refused or failed import leaves nothing behind."""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import shutil
import tarfile
import zipfile
from pathlib import Path
from typing import BinaryIO

from sqlalchemy.orm import Session

from backend import crud, permissions
from backend.core.config import Settings
from backend.core.identity import Principal
from backend.errors import Invalid
from backend.models import Run
from backend.services.runs import run_meta
from jobs.kineto.imports import import_traces, is_trace_name
from jobs.spec import SpecError, parse_spec, text_problem

log = logging.getLogger(__name__)

ARCHIVES = (".zip", ".tar.gz", ".tgz")
MAX_FILES = 4096  # per import, archive members included
CHUNK = 1 << 20


def _suffix(name: str) -> str | None:
    low = name.lower()
    return next((s for s in (".json.gz", ".json", *ARCHIVES) if low.endswith(s)), None)


class _Budget:
    """Bytes written to the staging folder, against the import's limit."""

    def __init__(self, limit: int):
        self.limit, self.used = limit, 0

    def copy(self, src: BinaryIO, dest: Path, shown: str) -> None:
        with open(dest, "wb") as f:
            while chunk := src.read(CHUNK):
                self.used += len(chunk)
                if self.used > self.limit:
                    raise Invalid(f"files: {shown}: the import is over its limit of "
                                  f"{self.limit:,} bytes (PARALAB_IMPORT_MAX_MB, uncompressed "
                                  "archive members included; .json.gz files count compressed)",
                                  field="files")
                f.write(chunk)


def _unpack(archive: Path, shown: str, stage: Path, budget: _Budget,
            names: dict[Path, str]) -> None:
    """The .json / .json.gz regular-file members of a zip or tar.gz, each to a staged name of
    our own (links, devices, folders and other files are skipped)."""
    def take(member_name: str, open_member) -> None:
        if not is_trace_name(member_name.lower()):
            return
        if len(names) >= MAX_FILES:
            raise Invalid(f"files: {shown}: more than {MAX_FILES} trace files", field="files")
        dest = stage / f"f{len(names):05d}{_suffix(member_name)}"
        with open_member() as src:
            budget.copy(src, dest, f"{shown}:{member_name}")
        names[dest] = f"{shown}:{member_name}"

    try:
        if shown.lower().endswith(".zip"):
            with zipfile.ZipFile(archive) as z:
                for info in z.infolist():
                    if not info.is_dir():
                        take(info.filename, lambda i=info: z.open(i))
        else:
            with tarfile.open(archive, "r:gz") as t:
                for m in t:
                    if m.isfile():
                        take(m.name, lambda m=m: t.extractfile(m))
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, OSError) as exc:
        raise Invalid(f"files: {shown}: not a readable {_suffix(shown)} archive ({exc})",
                      field="files") from None


def stage_uploads(uploads: list[tuple[str, BinaryIO]], stage: Path,
                  limit: int) -> dict[Path, str]:
    """Each upload (name, stream) into `stage`: {staged path: the name to show}."""
    budget, names = _Budget(limit), {}
    if not uploads:
        raise Invalid("files: give one trace file per rank (.json / .json.gz) or one .zip / "
                      ".tar.gz of a trace folder", field="files")
    for i, (shown, src) in enumerate(uploads):
        shown = (shown or f"file {i + 1}")[:200]
        suffix = _suffix(shown)
        if suffix is None:
            raise Invalid(f"files: {shown}: not a trace file or archive (.json, .json.gz, "
                          ".zip, .tar.gz, .tgz)", field="files")
        if suffix in ARCHIVES:
            archive = stage / f"archive-{i}{suffix}"
            budget.copy(src, archive, shown)
            _unpack(archive, shown, stage, budget, names)
            archive.unlink()
        else:
            dest = stage / f"f{len(names):05d}{suffix}"
            budget.copy(src, dest, shown)
            names[dest] = shown
    if not names:
        raise Invalid("files: no .json / .json.gz trace file in the upload", field="files")
    return names


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _spec(name: str, world: int, steps: int):
    try:
        return parse_spec({"kind": "import", "name": name, "parallel": {"dp": world},
                           "runtime": {"nproc_per_node": world, "queue": "import"},
                           "train": {"steps": max(1, steps)}},
                          imported=True, max_world_size=1 << 30)
    except SpecError as exc:
        raise Invalid(errors=[{**e, "loc": ["body", *e["loc"]]} for e in exc.errors]) from None


def create(db: Session, settings: Settings, user: Principal, *, name: str, tags: list[str],
           notes: str, uploads: list[tuple[str, BinaryIO]],
           allow_missing_ranks: bool = False, client: str | None = None) -> Run:
    permissions.require_submit(user)
    name = (name or "").strip()
    tags, notes, errors = run_meta({"tags": tags, "notes": notes})
    if not 1 <= len(name) <= 200:
        errors.append({"loc": ["body", "name"], "msg": "must be 1-200 characters",
                       "type": "value_error"})
    elif problem := text_problem(name):
        errors.append({"loc": ["body", "name"], "msg": problem, "type": "string_unsafe"})
    if errors:
        raise Invalid(errors=errors)
    run_id = crud.new_run_id()
    stage = settings.data_dir.resolve() / "imports" / f"{run_id}-{secrets.token_hex(4)}"
    stage.mkdir(parents=True)
    try:
        names = stage_uploads(uploads, stage, settings.import_max_mb << 20)
        out = stage / "run"
        try:
            got = import_traces(sorted(names), out, names=names,
                                allow_missing_ranks=allow_missing_ranks)
        except ValueError as exc:
            raise Invalid(f"files: {exc}", field="files") from None
        spec = _spec(name, got["world_size"], got["steps"])
        kept = out / "kineto"  # the profiler's own files stay with the run (re-analysis)
        kept.mkdir()
        for path, shown in names.items():
            os.replace(path, kept / f"rank{got['rank_of'][path]}{_suffix(shown)}")
        dest = settings.runs_dir / run_id
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(out, dest)
        try:
            files = [(p.relative_to(dest).as_posix(), p.stat().st_size, _sha256(p))
                     for p in sorted(dest.rglob("*")) if p.is_file()]
            summary = {"headline": got["headline"], "import": {
                "source": "kineto", "world_size": got["world_size"], "ranks": got["ranks"],
                "backend": got["backend"], "records": got["records"],
                "files": sorted(names.values())}}
            run = crud.create_imported(db, spec, run_id, owner=user.username, tags=tags,
                                       notes=notes, summary=summary, files=files)
        except Exception:
            db.rollback()
            shutil.rmtree(dest, ignore_errors=True)
            raise
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    crud.audit(db, user.username, "run.import", run.id,
               {"name": run.name, "world_size": run.world_size,
                "files": len(names)}, client)
    return run
