"""`paralab import PATH... --name NAME`: PyTorch profiler traces made elsewhere become a run
(POST /api/imports, docs/imports.md). PATH is a trace folder (as torch.profiler's
tensorboard_trace_handler writes it: every .json / .json.gz under it), trace files, or one
.zip / .tar.gz; the files are streamed from disk, not read into memory."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from backend.cli.client import CliError, _request

SUFFIXES = (".json", ".json.gz", ".zip", ".tar.gz", ".tgz")


def add_parser(sub) -> None:
    s = sub.add_parser("import", help="import PyTorch profiler (Kineto) traces as a run")
    s.add_argument("paths", nargs="+", metavar="PATH",
                   help="a trace folder, per-rank .json / .json.gz files, or a .zip / .tar.gz")
    s.add_argument("--name", required=True, help="the run's name")
    s.add_argument("--tag", action="append", default=[], help="a tag (repeat)")
    s.add_argument("--notes", default="")
    s.add_argument("--allow-missing-ranks", action="store_true",
                   help="analyse the ranks given although their world size names more")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_import)


def trace_files(paths: list[str]) -> list[Path]:
    """The files to upload: a folder's .json / .json.gz files (recursively, sorted), the
    files named; a CliError for a path that is neither."""
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            found = sorted(f for f in p.rglob("*") if f.is_file()
                           and f.name.lower().endswith((".json", ".json.gz")))
            if not found:
                raise CliError(f"{p}: no .json or .json.gz trace files in this folder")
            out += found
        elif p.is_file():
            if not p.name.lower().endswith(SUFFIXES):
                raise CliError(f"{p}: not a trace file or archive ({', '.join(SUFFIXES)})")
            out.append(p)
        else:
            raise CliError(f"{p}: no such file or folder")
    return out


def cmd_import(a) -> int:
    files = trace_files(a.paths)
    data = {"name": a.name, "notes": a.notes, "tags": a.tag,
            "allow_missing_ranks": "true" if a.allow_missing_ranks else "false"}
    with contextlib.ExitStack() as stack:
        parts = [("files", (f.name, stack.enter_context(open(f, "rb")),
                            "application/octet-stream")) for f in files]
        run = _request("POST", "/api/imports", data=data, files=parts, timeout=3600)
    if a.json:
        print(json.dumps(run, indent=1))
    else:
        print(f"{run['id']}  import  {run['status']}  world size {run['world_size']}  "
              f"({len(files)} file(s))")
    return 0
