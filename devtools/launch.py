"""The one launcher of the multi-rank tests and benchmarks: `torchrun` (python -m
torch.distributed.run) from the repository root on a free port, gloo on CPU, one thread per rank.

    torchrun(nproc, args)           the process, ARGS after `--nproc-per-node N --master-*`
    run_job(out, spec, nproc)       one `-m jobs.train` run into OUT (raises with the ranks' errors)
    run_worker(script, nproc, out)  a worker script that writes OUT/result.json; returns it
    read_trace(run_dir, rank)       one rank's trace records

tests/support/launch.py adds the tests' own launches (several runs in one process group).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from jobs.torchrun import MODULE as TORCHRUN
from jobs.torchrun import START_ENV

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(nproc: int, args: list[str], *, env: dict | None = None, inherit: bool = True,
             timeout: float = 600) -> subprocess.CompletedProcess:
    """`torchrun --nproc-per-node nproc ARGS` from the repo root; retried on a new port when
    another process grabbed the probed one before the rendezvous bound it. The environment is
    this process's (unless `inherit` is False) with OMP_NUM_THREADS=1 and PYTHONPATH=ROOT,
    then `env` over it. The ranks of every module or script but a user's script come from a
    fork server (jobs/torchrun.py START_ENV: the scripts launched here are written for it) unless
    the environment says PARALAB_RANK_START=exec."""
    base = dict(os.environ) if inherit else {"PATH": "/usr/bin:/bin"}
    e = {START_ENV: "fork", **base, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT),
         **(env or {})}
    for _ in range(3):
        argv = [sys.executable, "-m", TORCHRUN, "--nproc-per-node", str(nproc),
                "--master-addr", "127.0.0.1", "--master-port", str(free_port()), *args]
        proc = subprocess.run(argv, cwd=ROOT, env=e, capture_output=True, text=True,
                              timeout=timeout)
        if proc.returncode == 0 or "ddress already in use" not in proc.stderr:
            break
    return proc


def raise_failed(proc: subprocess.CompletedProcess, out: Path | None) -> None:
    errs = "\n".join(f.read_text() for f in out.rglob("error-rank*.txt")) if out else ""
    raise AssertionError(f"torchrun failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n"
                         f"{proc.stderr[-4000:]}\n{errs}")


def run_job(out: Path, spec: dict, nproc: int, *, env: dict | None = None,
            timeout: float = 600) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "spec.json").write_text(json.dumps(spec))
    proc = torchrun(nproc, ["-m", "jobs.train", "--spec", str(out / "spec.json"), "--out",
                            str(out)], env=env, timeout=timeout)
    if proc.returncode != 0:
        raise_failed(proc, out)
    return out


def run_worker(script: Path, nproc: int, out: Path, *args: str, env: dict | None = None,
               timeout: float = 600) -> dict:
    """Run a worker script on `nproc` ranks; return rank 0's `result.json` from `out`."""
    out.mkdir(parents=True, exist_ok=True)
    proc = torchrun(nproc, [str(script), str(out), *args], env=env, timeout=timeout)
    if proc.returncode != 0:
        raise_failed(proc, out)
    return json.loads((out / "result.json").read_text())


def read_trace(run_dir: Path, rank: int) -> list[dict]:
    return [json.loads(line) for line in
            (run_dir / f"trace-rank{rank}.jsonl").read_text().splitlines()]
