"""`paralab up` survives its worker (issue 14, item 4): kill -9 of the worker leaves the API up,
a new worker is started (with back-off) and registers, and a run submitted afterwards
succeeds. On the embedded default (SQLite, filesystem broker), as `make run` starts it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import httpx
import pytest

from tests.conftest import FINISHED, ROOT, free_port, pids_with_env, wait_for

pytestmark = pytest.mark.slow

SHORT = {"preset": "ddp", "train": {"steps": 2},
         "model": {"arch": "timed", "layers": 2, "hidden": 16, "t_forward": 0.001,
                   "t_backward_input": 0.001, "t_backward_weight": 0.001}}


def test_up_restarts_a_killed_worker_and_keeps_the_api(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    data = tmp_path / "var"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PARALAB_") and k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(PARALAB_DATA_DIR=str(data), PARALAB_PORT=str(port), OMP_NUM_THREADS="1",
               PARALAB_WORKER_HEARTBEAT_S="1")
    out = tmp_path / "up.log"
    proc = subprocess.Popen([sys.executable, "-m", "backend.cli", "up"], cwd=ROOT, env=env,
                            stdout=open(out, "ab"), stderr=subprocess.STDOUT,
                            start_new_session=True)

    def log() -> str:
        return out.read_text(errors="replace")

    def worker_pids() -> list[int]:
        try:
            return [w["info"]["pid"] for w in httpx.get(f"{url}/api/workers").json()]
        except httpx.TransportError:
            return []
    try:
        wait_for(lambda: "paralab is running at" in log(), 300, "paralab up to start")
        [first] = wait_for(worker_pids, 120, "the worker to report in")
        api_pid = next(p for p in pids_with_env("PARALAB_DATA_DIR", str(data.resolve()))
                       if b"serve" in open(f"/proc/{p}/cmdline", "rb").read().split(b"\0"))
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: "the worker exited (code -9); starting it again in 1 s" in log(), 60,
                 "up to see the worker die")
        assert proc.poll() is None, log()[-3000:]
        assert httpx.get(f"{url}/api/health/live").status_code == 200
        wait_for(lambda: (p := worker_pids()) and p[0] != first, 120,
                 "a new worker to report in")
        assert "worker started again" in log() and "stopping" not in log()
        assert os.path.exists(f"/proc/{api_pid}")  # the same API process throughout
        run = httpx.post(f"{url}/api/runs", json=SHORT).json()
        done = wait_for(lambda: (r := httpx.get(f"{url}/api/runs/{run['id']}").json())[
            "status"] in FINISHED and r, 180, "the run to finish")
        assert done["status"] == "succeeded", done["error"]
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(60)
        wait_for(lambda: not pids_with_env("PARALAB_DATA_DIR", str(data.resolve())), 30,
                 "every child of paralab up to stop")
