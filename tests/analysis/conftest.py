"""Real reference runs for the analysis tests, launched once per session (gloo, CPU)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(out: Path, spec: dict, nproc: int) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "spec.json").write_text(json.dumps(spec))
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{_free_port()}",
            "-m", "jobs.train", "--spec", str(out / "spec.json"), "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    p = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    if p.returncode != 0:
        errs = "\n".join(f.read_text() for f in out.glob("error-rank*.txt"))
        raise AssertionError(f"torchrun failed ({p.returncode}):\n{p.stderr[-3000:]}\n{errs}")
    return out


ZERO3_4 = {"preset": "zero3", "name": "analysis-zero3", "parallel": {"dp": 4},
           "runtime": {"nproc_per_node": 4}, "train": {"steps": 3}}
PP_2 = {"preset": "pp-1f1b", "name": "analysis-pp", "train": {"steps": 3}}


@pytest.fixture(scope="session")
def zero3_run(tmp_path_factory) -> Path:
    """A 4-rank ZeRO-3 run of the reference engine."""
    return launch(tmp_path_factory.mktemp("zero3"), ZERO3_4, 4)


@pytest.fixture(scope="session")
def pp_run(tmp_path_factory) -> Path:
    """A 2-rank 1F1B pipeline run of the reference engine."""
    return launch(tmp_path_factory.mktemp("pp"), PP_2, 2)
