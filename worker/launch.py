"""Pure functions: (spec, run folder) -> the torchrun argv and the job's environment.

No user string reaches a shell: the argv is a list, and the only spec values in it are the
validated integers of `runtime`; the spec itself travels as a file.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

JOB_MODULES = {"train": "jobs.train", "collective_bench": "jobs.collective_bench"}

# Credentials and service URLs of the worker never reach user code running in the job.
_SCRUBBED = ("PARALAB_WORKER_TOKEN", "PARALAB_SECRET_KEY", "DATABASE_URL", "REDIS_URL",
             "PARALAB_DATABASE_URL", "PARALAB_REDIS_URL")


def build_argv(spec: Mapping, *, python: str, spec_path: Path, out_dir: Path,
               log_dir: Path, resume_dir: Path | None = None) -> list[str]:
    kind = spec["kind"]
    if kind not in JOB_MODULES:
        raise ValueError(f"kind: no job module for {kind!r}")
    rt = spec["runtime"]
    nnodes, nproc = int(rt["nnodes"]), int(rt["nproc_per_node"])
    restarts = int(rt.get("max_restarts", 0))
    assert nnodes == 1, "multi-host placement is refused by spec validation"
    assert 1 <= nproc <= 4096 and 0 <= restarts <= 10
    return [
        python, "-m", "torch.distributed.run",
        "--standalone",  # single host: c10d rendezvous on a free localhost port
        "--nnodes", "1",
        "--nproc-per-node", str(nproc),
        # torchrun's own restart: every rank again, each loading the last complete checkpoint
        "--max-restarts", str(restarts),
        "--tee", "3",  # each rank's lines arrive prefixed "[defaultR]:" for the rank filter
        "--log-dir", str(log_dir),
        "-m", JOB_MODULES[kind],
        "--spec", str(spec_path),
        "--out", str(out_dir),
        *(["--resume", str(resume_dir)] if resume_dir is not None else []),
    ]


def supervised(argv: list[str], *, python: str, grace_s: float) -> list[str]:
    """Run `argv` under worker.shim, which stops the whole job when the worker goes away."""
    return [python, "-m", "worker.shim", "--grace", f"{grace_s:g}", "--", *argv]


def build_env(base: Mapping[str, str], *, run_id: str, omp_threads: int) -> dict[str, str]:
    env = {k: v for k, v in base.items() if k not in _SCRUBBED}
    env.update({
        "PARALAB_RUN_ID": run_id,
        "OMP_NUM_THREADS": str(omp_threads),
        "PYTHONUNBUFFERED": "1",
        "PYTHONWARNINGS": env.get("PYTHONWARNINGS", "ignore::UserWarning"),
    })
    return env


def job_timeout_s(spec: Mapping, cap_s: float) -> float:
    return min(float(spec["runtime"]["timeout_s"]), cap_s)
