"""The pure argv/env builder of the worker."""

from pathlib import Path

import pytest

from jobs.spec import parse_spec
from paralab_core.config import job_timeout_s
from worker.launch import build_argv, build_env, supervised


def _argv(spec):
    return build_argv(spec.to_dict(), python="/py", spec_path=Path("/r/spec.json"),
                      out_dir=Path("/r/out"), log_dir=Path("/r/logs"))


def test_argv_is_a_list_running_torchrun_on_the_job_module():
    spec = parse_spec({"preset": "ddp", "name": "x; rm -rf / `id` $(id)"})
    argv = _argv(spec)
    assert argv[:3] == ["/py", "-m", "jobs.torchrun"]
    assert argv[argv.index("--nproc-per-node") + 1] == "2"
    assert argv[-6:] == ["-m", "jobs.train", "--spec", "/r/spec.json", "--out", "/r/out"]
    # The name (a user string) never appears: the spec travels as a file.
    assert not any("rm -rf" in a for a in argv)


def test_restarts_and_resume_reach_torchrun_and_the_job():
    spec = parse_spec({"preset": "ddp", "runtime": {"max_restarts": 2}})
    argv = build_argv(spec.to_dict(), python="/py", spec_path=Path("/r/spec.json"),
                      out_dir=Path("/r/out"), log_dir=Path("/r/logs"),
                      resume_dir=Path("/r/resume/checkpoints/step-000002"))
    assert argv[argv.index("--max-restarts") + 1] == "2"
    assert argv[-2:] == ["--resume", "/r/resume/checkpoints/step-000002"]
    assert _argv(parse_spec({"preset": "ddp"}))[_argv(parse_spec({"preset": "ddp"})).index(
        "--max-restarts") + 1] == "0"


def test_collective_kind_runs_its_own_module():
    spec = parse_spec({"preset": "collective-sweep", "runtime": {"nproc_per_node": 4}})
    argv = _argv(spec)
    assert argv[argv.index("-m", 3) + 1] == "jobs.collective_bench"
    assert argv[argv.index("--nproc-per-node") + 1] == "4"


def test_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="kind"):
        build_argv({"kind": "mine", "runtime": {"nnodes": 1, "nproc_per_node": 1}}, python="p",
                   spec_path=Path("s"), out_dir=Path("o"), log_dir=Path("l"))


def test_env_carries_run_id_and_drops_worker_secrets():
    env = build_env({"PATH": "/bin", "PARALAB_WORKER_TOKEN": "s", "DATABASE_URL": "pg://x",
                     "REDIS_URL": "redis://x"}, run_id="abc", omp_threads=1)
    assert env["PARALAB_RUN_ID"] == "abc" and env["OMP_NUM_THREADS"] == "1"
    assert env["PATH"] == "/bin"
    assert not {"PARALAB_WORKER_TOKEN", "DATABASE_URL", "REDIS_URL"} & set(env)


def test_timeout_is_capped():
    spec = parse_spec({"preset": "ddp", "runtime": {"timeout_s": 500}}).to_dict()
    assert job_timeout_s(spec, 100) == 100 and job_timeout_s(spec, 1000) == 500


def test_the_job_runs_under_its_shim():
    argv = supervised(["torchrun", "x"], python="/py", grace_s=5)
    assert argv == ["/py", "-m", "worker.shim", "--grace", "5", "--", "torchrun", "x"]


def test_shim_stops_the_job_when_its_parent_dies(tmp_path):
    """worker -> shim -> job: SIGKILL the 'worker' and the shim takes the job down."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.conftest import pids_with_run_id, wait_for
    run_id = f"shimtest{os.getpid()}"
    env = {**os.environ, "PARALAB_RUN_ID": run_id}
    # The job ignores SIGTERM, so only the shim's SIGKILL after the grace period stops it.
    job = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
           "signal.SIG_IGN); time.sleep(600)"]
    fake_worker = subprocess.Popen(
        [sys.executable, "-c", "import os, subprocess, sys, time; subprocess.Popen(sys.argv[2:], "
         "env={**os.environ, 'PARALAB_RUN_ID': sys.argv[1]}); time.sleep(600)", run_id,
         *supervised(job, python=sys.executable, grace_s=1)],
        env={k: v for k, v in env.items() if k != "PARALAB_RUN_ID"}, start_new_session=True)
    try:
        wait_for(lambda: len(pids_with_run_id(run_id)) == 2, 30, "shim and job to start")
        time.sleep(0.5)  # let the job install its SIGTERM-ignoring handler
        os.kill(fake_worker.pid, signal.SIGKILL)
        fake_worker.wait()
        wait_for(lambda: not pids_with_run_id(run_id), 30, "the shim to stop the job")
    finally:
        for pid in pids_with_run_id(run_id):
            os.kill(pid, signal.SIGKILL)
