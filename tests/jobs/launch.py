"""Helpers for multi-rank tests: real torchrun launches on free ports, trace readers."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(nproc: int, module_args: list[str], *, env: dict | None = None,
             timeout: float = 240) -> subprocess.CompletedProcess:
    argv = [*TORCHRUN, "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "-m", *module_args]
    e = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(argv, cwd=ROOT, env=e, capture_output=True, text=True,
                          timeout=timeout)


def multirun(nproc: int, runs: list[tuple[str, dict]], out: Path, *, env=None):
    out.mkdir(parents=True, exist_ok=True)
    specs = out / "specs.json"
    specs.write_text(json.dumps(runs))
    p = torchrun(nproc, ["tests.jobs.multirun", "--specs", str(specs), "--out", str(out)],
                 env={"PARALAB_DUMP_PARAMS": "1", **(env or {})})
    if p.returncode != 0:
        errs = "\n".join(f.read_text() for f in out.rglob("error-rank*.txt"))
        raise AssertionError(f"torchrun failed ({p.returncode}):\n{p.stderr[-4000:]}\n{errs}")
    return p


def read_trace(run_dir: Path, rank: int) -> list[dict]:
    return [json.loads(line) for line in
            (run_dir / f"trace-rank{rank}.jsonl").read_text().splitlines()]
