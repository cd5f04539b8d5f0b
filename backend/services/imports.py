"""Import runs: PyTorch profiler (Kineto) traces made elsewhere become a run of kind `import`
(docs/imports.md). The body is parsed as it arrives, each uploaded file streamed into a
staging folder under the data directory (held to PARALAB_IMPORT_MAX_MB as it is written, so an
over-large body is refused early and nothing is spooled elsewhere), archives unpacked
by member (a member's name is only ever shown, never used as a path), checked and analysed by
jobs/kineto/imports.py, then moved into the run's folder and stored with the run in one
transaction: a refused or failed import leaves nothing behind."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import secrets
import shutil
import tarfile
import zipfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from pydantic import TypeAdapter, ValidationError
from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header
from sqlalchemy.orm import Session

from backend import crud, permissions
from backend.core.config import Settings
from backend.core.identity import Principal
from backend.errors import Invalid
from backend.models import Run
from backend.services.multipart import StreamedParts
from backend.services.runs import run_meta
from jobs.kineto.imports import import_traces, is_trace_name
from jobs.spec import SpecError, parse_spec, text_problem

log = logging.getLogger(__name__)

ARCHIVES = (".zip", ".tar.gz", ".tgz")
MAX_FILES = 4096  # per import, archive members included
CHUNK = 1 << 20
FIELD_MAX = 1 << 20  # bytes of one text field (name, a tag, notes), as Starlette's forms
MAX_FIELDS = 1000  # text fields of one body (tags repeat), as Starlette's forms
MAX_FIELDS_BYTES = 4 << 20  # the text fields' share of a body, for the announced-size check
SLACK = 64 << 10  # multipart framing and part headers


def _suffix(name: str) -> str | None:
    low = name.lower()
    return next((s for s in (".json.gz", ".json", *ARCHIVES) if low.endswith(s)), None)


class _Budget:
    """Bytes written to the staging folder, against the import's limit."""

    def __init__(self, limit: int):
        self.limit, self.used = limit, 0

    def charge(self, n: int, shown: str) -> None:
        """Before `n` more bytes of `shown` are written: refused past the limit."""
        self.used += n
        if self.used > self.limit:
            raise Invalid(f"files: {shown}: the import is over its limit of "
                          f"{self.limit:,} bytes (PARALAB_IMPORT_MAX_MB, uncompressed "
                          "archive members included; .json.gz files count compressed)",
                          field="files")

    def copy(self, src: BinaryIO, dest: Path, shown: str) -> None:
        with open(dest, "wb") as f:
            while chunk := src.read(CHUNK):
                self.charge(len(chunk), shown)
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


def _shown(name: str, i: int) -> tuple[str, str]:
    """(the name to show, its suffix) of the i-th uploaded file; 422 unless a trace or an
    archive of traces."""
    shown = (name or f"file {i + 1}")[:200]
    suffix = _suffix(shown)
    if suffix is None:
        raise Invalid(f"files: {shown}: not a trace file or archive (.json, .json.gz, "
                      ".zip, .tar.gz, .tgz)", field="files")
    return shown, suffix


def place(received: list[tuple[Path, str]], stage: Path, budget: _Budget) -> dict[Path, str]:
    """The uploads as received into `stage` (path, name to show), each trace under a staged
    name, archives unpacked by member: {staged path: the name to show}."""
    names: dict[Path, str] = {}
    if not received:
        raise Invalid("files: give one trace file per rank (.json / .json.gz) or one .zip / "
                      ".tar.gz of a trace folder", field="files")
    for i, (path, name) in enumerate(received):
        shown, suffix = _shown(name, i)
        if suffix in ARCHIVES:
            _unpack(path, shown, stage, budget, names)
            path.unlink()
        else:
            dest = stage / f"f{len(names):05d}{suffix}"
            os.replace(path, dest)
            names[dest] = shown
    if not names:
        raise Invalid("files: no .json / .json.gz trace file in the upload", field="files")
    return names


@dataclass
class Received:
    """An import's body as streamed into its staging folder: the files as received (path,
    name sent), the form's text fields, and what the files were charged."""

    stage: Path
    budget: _Budget
    files: list[tuple[Path, str]] = field(default_factory=list)
    fields: dict[str, list[str]] = field(default_factory=dict)


class _Form(StreamedParts):
    """python-multipart's callbacks: each `files` part written to the staging folder as it
    arrives and charged to the import's budget (so the limit stops the body early), the text
    fields kept up to FIELD_MAX bytes each."""

    def __init__(self, got: Received):
        self.got, self.fh, self.text, self.name, self.shown = got, None, None, "", ""
        super().__init__()

    def started(self, opts: dict) -> None:
        self.name = opts.get(b"name", b"").decode("utf-8", "replace")
        if self.name != "files":
            if sum(map(len, self.got.fields.values())) >= MAX_FIELDS:
                raise Invalid(f"body: more than {MAX_FIELDS} form fields", field="body")
            self.text = bytearray()
            return
        i = len(self.got.files)
        if i >= MAX_FILES:
            raise Invalid(f"files: more than {MAX_FILES} trace files", field="files")
        self.shown, suffix = _shown(opts.get(b"filename", b"").decode("utf-8", "replace"), i)
        path = self.got.stage / f"upload-{i}{suffix}"
        self.fh = open(path, "xb")  # noqa: SIM115 - closed in end()
        self.got.files.append((path, self.shown))

    def data(self, data, start, end):
        if self.fh is not None:
            self.got.budget.charge(end - start, self.shown)
            self.fh.write(data[start:end])
        elif self.text is not None:
            if len(self.text) + end - start > FIELD_MAX:
                raise Invalid(f"{self.name}: over {FIELD_MAX:,} bytes", field=self.name)
            self.text += data[start:end]

    def end(self):
        if self.fh is not None:
            self.fh.close()
            self.fh = None
        if self.text is not None:
            self.got.fields.setdefault(self.name, []).append(self.text.decode("utf-8",
                                                                              "replace"))
            self.text = None


async def receive(chunks: AsyncIterator[bytes], content_type: str | None,
                  content_length: str | None, settings: Settings) -> Received:
    """Stream a POST /api/imports body into a new staging folder under DATA_DIR/imports: its
    files written there as they arrive and refused once past PARALAB_IMPORT_MAX_MB; a body
    announced larger than the limit plus the form's text share is refused before a byte is
    read. On any refusal the staging folder is gone; else create() removes it."""
    limit = settings.import_max_mb << 20
    ctype, opts = parse_options_header(content_type or "")
    boundary = opts.get(b"boundary")
    if ctype != b"multipart/form-data" or not boundary:
        raise Invalid("files: send the traces as multipart/form-data, each in a field `files`",
                      field="files")
    if content_length and content_length.isdigit() and \
            int(content_length) > limit + MAX_FIELDS_BYTES + SLACK:
        raise Invalid(f"files: the body ({int(content_length):,} bytes) is over the import's "
                      f"limit of {limit:,} bytes (PARALAB_IMPORT_MAX_MB)", field="files")
    stage = settings.data_dir.resolve() / "imports" / f"body-{secrets.token_hex(8)}"
    stage.mkdir(parents=True)
    form = _Form(Received(stage, _Budget(limit)))
    parser = MultipartParser(boundary, form.callbacks())
    try:
        async for chunk in chunks:  # disk writes off the event loop
            await asyncio.to_thread(parser.write, chunk)
        parser.finalize()
        if form.fh is not None or form.text is not None:
            raise Invalid("files: the body ended inside a part", field="files")
    except MultipartParseError as exc:
        form.end()
        shutil.rmtree(stage, ignore_errors=True)
        raise Invalid(f"files: the multipart body could not be read ({exc})",
                      field="files") from None
    except BaseException:
        form.end()
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return form.got


def form_values(got: Received) -> dict:
    """The form's fields as POST /api/imports declares them (name, tags, notes,
    allow_missing_ranks); 422 naming the field otherwise."""
    f = got.fields
    if not f.get("name"):
        raise Invalid(errors=[{"loc": ["body", "name"], "msg": "Field required",
                               "type": "missing"}])
    try:
        allow = TypeAdapter(bool).validate_python(
            (f.get("allow_missing_ranks") or ["false"])[-1])
    except ValidationError:
        raise Invalid(errors=[{"loc": ["body", "allow_missing_ranks"], "type": "bool_parsing",
                               "msg": "Input should be a valid boolean"}]) from None
    return {"name": f["name"][-1], "tags": f.get("tags", []),
            "notes": (f.get("notes") or [""])[-1], "allow_missing_ranks": allow}


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


def create(db: Session, settings: Settings, user: Principal, body: Received,
           client: str | None = None) -> Run:
    """The run of an import's body as receive() staged it; the staging folder is removed
    whatever happens."""
    try:
        return _create(db, settings, user, body, client)
    finally:
        shutil.rmtree(body.stage, ignore_errors=True)


def _create(db: Session, settings: Settings, user: Principal, body: Received,
            client: str | None) -> Run:
    permissions.require_submit(user)
    form = form_values(body)
    name, allow_missing_ranks = form["name"].strip(), form["allow_missing_ranks"]
    tags, notes, errors = run_meta({"tags": form["tags"], "notes": form["notes"]})
    if not 1 <= len(name) <= 200:
        errors.append({"loc": ["body", "name"], "msg": "must be 1-200 characters",
                       "type": "value_error"})
    elif problem := text_problem(name):
        errors.append({"loc": ["body", "name"], "msg": problem, "type": "string_unsafe"})
    if errors:
        raise Invalid(errors=errors)
    run_id = crud.new_run_id()
    stage = body.stage  # (create removes it)
    names = place(body.files, stage, body.budget)
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
    crud.audit(db, user.username, "run.import", run.id,
               {"name": run.name, "world_size": run.world_size,
                "files": len(names)}, client)
    return run
