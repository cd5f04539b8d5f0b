"""The multi-rank tests' launches: devtools/launch.py's (shared with bench/), and several train
runs in one launch (one process group) for the correctness gate.

    torchrun, run_job, run_worker, read_trace   devtools/launch.py
    multirun(nproc, runs, out)      several train runs in one launch (tests/jobs/multirun.py)
    launch_by_world(...)            one multirun launch per world size
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from devtools.launch import ROOT as ROOT
from devtools.launch import free_port as free_port
from devtools.launch import raise_failed as _raise
from devtools.launch import read_trace as read_trace
from devtools.launch import run_job as run_job
from devtools.launch import run_worker as run_worker
from devtools.launch import torchrun


def multirun(nproc: int, runs: list[tuple[str, dict]], out: Path, *, env: dict | None = None,
             timeout: float = 600) -> subprocess.CompletedProcess:
    """Several runs in one launch (one process group), parameters and step-0 gradients dumped
    for the correctness gate."""
    out.mkdir(parents=True, exist_ok=True)
    specs = out / "specs.json"
    specs.write_text(json.dumps(runs))
    proc = torchrun(nproc, ["-m", "tests.jobs.multirun", "--specs", str(specs), "--out",
                            str(out)], env={"PARALAB_DUMP_PARAMS": "1", **(env or {})},
                    timeout=timeout)
    if proc.returncode != 0:
        _raise(proc, out)
    return proc


def launch_by_world(tmp_path_factory, runs: dict[int, list[tuple[str, dict]]],
                    prefix: str) -> dict[int, Path]:
    """One multirun launch per world size: {world size: its output folder}."""
    out = {}
    for n, named in runs.items():
        d = tmp_path_factory.mktemp(f"{prefix}{n}")
        multirun(n, named, d)
        out[n] = d
    return out
