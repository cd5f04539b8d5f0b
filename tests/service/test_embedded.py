"""The README's first command, exactly: `make run` starts the whole service on the embedded
default (SQLite under the data dir, Celery's filesystem:// broker, db+sqlite result backend),
runs a real 2-rank DDP job, and stops every child on Ctrl-C (SIGINT to its process group)."""

import os
import re
import signal
import subprocess

import httpx
import pytest

from tests.conftest import ROOT, free_port, pids_with_env, wait_for

pytestmark = pytest.mark.slow


def start_make_run(tmp_path, port):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PARALAB_") and k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(PARALAB_DATA_DIR=str(tmp_path / "var"), PARALAB_PORT=str(port),
               OMP_NUM_THREADS="1")
    log = open(tmp_path / "make-run.log", "ab")
    proc = subprocess.Popen(["make", "run"], cwd=ROOT, env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    return proc


def wait_url(tmp_path, proc, port):
    def ready():
        assert proc.poll() is None, (tmp_path / "make-run.log").read_text()[-3000:]
        return f"paralab is running at http://127.0.0.1:{port}" in (
            tmp_path / "make-run.log").read_text()
    wait_for(ready, 300, "make run to print its URL", interval=0.5)


def ctrl_c(proc, tmp_path):
    os.killpg(proc.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
    proc.wait(60)
    # Every process started for this service (API, worker, jobs) carries its data dir.
    wait_for(lambda: not pids_with_env("PARALAB_DATA_DIR", str(tmp_path / "var")), 15,
             "every child of make run to stop")


def test_make_run_embedded_default_end_to_end(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_make_run(tmp_path, port)
    try:
        wait_url(tmp_path, proc, port)
        health = httpx.get(f"{url}/api/health").json()
        assert health["checks"]["broker"]["url"] == "filesystem://"
        assert health["checks"]["database"]["url"].startswith("sqlite:///")
        assert (tmp_path / "var" / "paralab.db").exists()
        wait_for(lambda: httpx.get(f"{url}/api/workers").json(), 60, "the worker")
        run = httpx.post(f"{url}/api/runs", json={"preset": "ddp", "name": "embedded",
                                                  "train": {"steps": 3}}).json()
        done = wait_for(lambda: (r := httpx.get(f"{url}/api/runs/{run['id']}").json())[
            "status"] in ("succeeded", "failed", "cancelled", "timed_out") and r, 180,
            "the run to finish")
        assert done["status"] == "succeeded", done["error"]
        assert len(done["summary"]["loss"]) == 3
        files = {f["path"] for f in httpx.get(f"{url}/api/runs/{run['id']}/files").json()}
        assert {"trace-rank0.jsonl", "trace-rank1.jsonl"} <= files
        assert (tmp_path / "var" / "celery-results.db").exists()
        page = httpx.get(url + "/")
        assert page.status_code == 200 and "paralab" in page.text
    finally:
        ctrl_c(proc, tmp_path)
    assert proc.returncode in (0, 2, -signal.SIGINT)  # make dies of, or reports, the SIGINT
    log = (tmp_path / "make-run.log").read_text()
    assert "paralab: stopped" in log

    # A second `make run` reuses the environment: no install step runs.
    mark = len(log)
    proc = start_make_run(tmp_path, port)
    try:
        wait_for(lambda: (tmp_path / "make-run.log").read_text().count(
            "paralab is running at") >= 2, 300, "the second start")
    finally:
        ctrl_c(proc, tmp_path)
    second = (tmp_path / "make-run.log").read_text()[mark:]
    assert "pip install" not in second, second[:2000]
    assert re.search(r"paralab: stopped", second)
