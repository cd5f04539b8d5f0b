"""Pure functions: (spec, run folder) -> the torchrun argv and the job's environment.

No user string reaches a shell: the argv is a list, and the only spec values in it are the
validated integers of `runtime`; the spec itself travels as a file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from jobs.torchrun import MODULE as TORCHRUN
from worker.procs import PROC_KEY, proc_key

JOB_MODULES = {"train": "jobs.train", "collective_bench": "jobs.collective_bench",
               "compute_bench": "jobs.compute_bench", "script": "jobs.script_runner"}

# Credentials and service URLs of the worker never reach user code running in the job.
_SCRUBBED = ("PARALAB_WORKER_TOKEN", "PARALAB_SECRET_KEY", "DATABASE_URL", "REDIS_URL",
             "PARALAB_DATABASE_URL", "PARALAB_REDIS_URL")


@dataclass(frozen=True)
class Rendezvous:
    """One node's part of a multi-host run's c10d rendezvous: the endpoint node 0 serves (its
    worker's address and a port it chose free for this run), an ID unique to the run, whether
    this node serves it, and this node's own address (where rank 0's store listens, if torch
    makes it rank 0). torch assigns node ranks in the sorted order of the nodes' descriptors
    (address, then the agent's pid), so a node's torch rank is read back from the traces
    (GROUP_RANK), not assumed."""

    endpoint: str
    rdzv_id: str
    is_host: bool
    local_addr: str
    join_timeout_s: int = 300


def rendezvous_args(nnodes: int, rdzv: Rendezvous | None) -> list[str]:
    if rdzv is None:
        assert nnodes == 1, "a multi-host run's node launches with its rendezvous"
        return ["--standalone",  # single host: c10d rendezvous on a free localhost port
                "--nnodes", "1"]
    return ["--nnodes", str(nnodes), "--rdzv-backend", "c10d", "--rdzv-endpoint", rdzv.endpoint,
            "--rdzv-id", rdzv.rdzv_id,
            "--rdzv-conf", f"is_host={int(rdzv.is_host)},join_timeout={int(rdzv.join_timeout_s)}",
            "--local-addr", rdzv.local_addr]


def build_argv(spec: Mapping, *, python: str, spec_path: Path, out_dir: Path,
               log_dir: Path, resume_dir: Path | None = None,
               rdzv: Rendezvous | None = None, workdir: Path | None = None) -> list[str]:
    """`workdir`: a script run's unpacked working directory (the runner changes into it)."""
    kind = spec["kind"]
    if kind not in JOB_MODULES:
        raise ValueError(f"kind: no job module for {kind!r}")
    assert (kind == "script") == (workdir is not None), kind
    rt = spec["runtime"]
    nnodes, nproc = int(rt["nnodes"]), int(rt["nproc_per_node"])
    restarts = int(rt.get("max_restarts", 0))
    assert 1 <= nnodes <= 1024 and 1 <= nproc <= 4096 and 0 <= restarts <= 10
    return [
        python, "-m", TORCHRUN,  # torch's torchrun, without the teardown (jobs/torchrun.py)
        *rendezvous_args(nnodes, rdzv),
        "--nproc-per-node", str(nproc),
        # torchrun's own restart: every rank again, each loading the last complete checkpoint
        "--max-restarts", str(restarts),
        "--tee", "3",  # each rank's lines arrive prefixed "[defaultR]:" for the rank filter
        "--log-dir", str(log_dir),
        "-m", JOB_MODULES[kind],
        "--spec", str(spec_path),
        "--out", str(out_dir),
        *(["--resume", str(resume_dir)] if resume_dir is not None else []),
        *(["--workdir", str(workdir)] if workdir is not None else []),
    ]


def supervised(argv: list[str], *, python: str, grace_s: float) -> list[str]:
    """Run `argv` under worker.shim, which stops the whole job when the worker goes away."""
    return [python, "-m", "worker.shim", "--grace", f"{grace_s:g}", "--", *argv]


def build_env(base: Mapping[str, str], *, run_id: str, omp_threads: int,
              host_label: str | None = None, node: int | None = None) -> dict[str, str]:
    env = {k: v for k, v in base.items() if k not in _SCRUBBED}
    env.update({
        "PARALAB_RUN_ID": run_id,
        PROC_KEY: proc_key(run_id, node),  # what stops exactly this run's (node's) processes
        "OMP_NUM_THREADS": str(omp_threads),
        "PYTHONUNBUFFERED": "1",
        "PYTHONWARNINGS": env.get("PYTHONWARNINGS", "ignore::UserWarning"),
        # every line prefixed with its global rank (torchrun's default is the local rank,
        # which repeats on every host of a multi-host run)
        "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[${role_name}${rank}]:",
    })
    if host_label:  # the trace meta's hostname (jobs/entry.py host_meta)
        env["PARALAB_HOST_LABEL"] = host_label
    if node is not None:
        env["PARALAB_NODE"] = str(node)
    return env
