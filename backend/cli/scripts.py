"""`paralab submit --script ENTRY [--workdir DIR] [--nproc N] -- ARGS...`: the user's own
training script as a run (docs/scripts.md). The working directory is packed the way `ray job
submit --working-dir` packs it: every file git would see (`.gitignore` files honoured, with
pathspec's gitignore rules; `.git/` left out), as a .tar.gz uploaded to POST /api/uploads
(content-addressed: the same folder twice is one upload), then the run is submitted naming its
sha256. Standard library and pathspec only."""

from __future__ import annotations

import os
import tarfile
import tempfile
from pathlib import Path

import pathspec

from backend.cli.client import CliError, _request

MAX_FILES = 10_000  # the server refuses more (PARALAB_UPLOAD_MAX_FILES): say so before packing


def packed_files(root: Path) -> list[Path]:
    """The files of `root` git would see: every `.gitignore` on the way applies to its folder
    and below; `.git/` is never packed. Relative paths, sorted."""
    root = root.resolve()
    out: list[Path] = []
    specs: list[tuple[Path, pathspec.PathSpec]] = []
    for folder, dirs, files in os.walk(root):
        here = Path(folder)
        ignore = here / ".gitignore"
        if ignore.is_file():
            specs.append((here, pathspec.PathSpec.from_lines(
                "gitignore", ignore.read_text(errors="replace").splitlines())))

        def ignored(p: Path, is_dir: bool) -> bool:
            for base, spec in specs:
                if p.is_relative_to(base):
                    rel = p.relative_to(base).as_posix() + ("/" if is_dir else "")
                    if spec.match_file(rel):
                        return True
            return False
        dirs[:] = sorted(d for d in dirs if d != ".git" and not ignored(here / d, True))
        for f in sorted(files):
            p = here / f
            if not p.is_symlink() and p.is_file() and not ignored(p, False):
                out.append(p.relative_to(root))
                if len(out) > MAX_FILES:
                    raise CliError(f"{root}: more than {MAX_FILES} files to pack; add the big "
                                   "folders to .gitignore")
    return out


def pack(root: Path, dest: Path) -> int:
    """Write root's packed files to the .tar.gz `dest`; returns their count."""
    files = packed_files(root)
    with tarfile.open(dest, "w:gz") as tar:
        for rel in files:
            tar.add(root / rel, arcname=rel.as_posix(), recursive=False)
    return len(files)


def upload_workdir(root: Path) -> dict:
    if not root.is_dir():
        raise CliError(f"--workdir {root}: not a folder")
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / "workdir.tar.gz"
        n = pack(root, archive)
        with open(archive, "rb") as f:
            got = _request("POST", "/api/uploads", timeout=600,
                           files={"file": (f"{root.resolve().name}.tar.gz", f,
                                           "application/gzip")})
    return {**got, "packed": n}


def script_body(a, body: dict) -> dict:
    """The submit body of a script run: --script ENTRY, its arguments after `--`, the
    working directory uploaded (when given), merged over SPEC.json's fields."""
    script = dict(body.get("script") or {})
    script["entry"] = a.script
    script["args"] = list(a.script_args or [])
    if a.workdir:
        up = upload_workdir(Path(a.workdir))
        script["upload"] = up["sha256"]
        print(f"uploaded {a.workdir}: {up['packed']} files, {up['size']} bytes, "
              f"sha256 {up['sha256'][:12]}")
    runtime = dict(body.get("runtime") or {})
    if a.nproc:
        runtime["nproc_per_node"] = a.nproc
    return {**body, "kind": "script", "script": script, "runtime": runtime,
            "parallel": body.get("parallel") or {"dp": runtime.get("nproc_per_node", 2)}}
