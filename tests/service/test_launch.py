"""The pure argv/env builder of the worker."""

from pathlib import Path

import pytest

from jobs.spec import parse_spec
from worker.launch import build_argv, build_env, job_timeout_s


def _argv(spec):
    return build_argv(spec.to_dict(), python="/py", spec_path=Path("/r/spec.json"),
                      out_dir=Path("/r/out"), log_dir=Path("/r/logs"))


def test_argv_is_a_list_running_torchrun_on_the_job_module():
    spec = parse_spec({"preset": "ddp", "name": "x; rm -rf / `id` $(id)"})
    argv = _argv(spec)
    assert argv[:3] == ["/py", "-m", "torch.distributed.run"]
    assert argv[argv.index("--nproc-per-node") + 1] == "2"
    assert argv[-6:] == ["-m", "jobs.train", "--spec", "/r/spec.json", "--out", "/r/out"]
    # The name (a user string) never appears: the spec travels as a file.
    assert not any("rm -rf" in a for a in argv)


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
