"""`paralab up`: the whole service on one machine (what `make run` starts).

Applies migrations, starts the API/front end and one worker as children, prints the URL, and
on Ctrl-C / SIGINT / SIGTERM stops every child: the worker first (it stops its running jobs),
then the API; anything still alive after a grace period is killed with its process group.
Each child lives in its own session, so the terminal's Ctrl-C reaches only this supervisor,
and gets a parent-death signal, so nothing outlives a supervisor that is killed outright.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx

from backend.core.config import get_settings
from backend.core.security import ConfigError, check_startup
from backend.migrate import upgrade
from worker.procs import pdeathsig_preexec


def _spawn(args: list[str], env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "backend.cli", *args], env=env,
                            start_new_session=True, preexec_fn=pdeathsig_preexec(signal.SIGTERM))


def _stop(procs: list[subprocess.Popen], grace: float) -> None:
    for p in procs:  # the worker is first: it must stop its jobs while the API still listens
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def up(host: str | None = None, port: int | None = None) -> int:
    settings = get_settings()
    host, port = host or settings.host, port or settings.port
    try:  # before anything starts: secret key in team mode, loopback only in local mode
        check_startup(settings, host)
    except ConfigError as exc:
        print(f"paralab: {exc}", file=sys.stderr, flush=True)
        return 2
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    upgrade(settings.db_url)
    url = f"http://{host}:{port}"
    env = dict(os.environ, PARALAB_URL=url, PARALAB_HOST=host, PARALAB_PORT=str(port),
               PARALAB_DATA_DIR=str(settings.data_dir.resolve()))
    settings.resolved_worker_token()  # created once, before both children read it
    stopping = False

    def on_signal(signum, _frame):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    api = _spawn(["serve", "--host", host, "--port", str(port)], env)
    worker = _spawn(["worker"], env)
    procs = [worker, api]
    code = 0
    try:
        deadline = time.monotonic() + 60
        while not stopping:
            try:
                if httpx.get(f"{url}/api/health/live", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if api.poll() is not None or time.monotonic() > deadline:
                print(f"paralab: the API did not start on {url}", file=sys.stderr, flush=True)
                return 1
            time.sleep(0.2)
        if not stopping:
            broker = "Redis" if settings.redis_url else "embedded filesystem broker"
            db = settings.db_url.split("@")[-1]
            print(f"\nparalab is running at {url}  (database: {db}; queue: {broker})\n"
                  "Press Ctrl-C to stop.\n", flush=True)
        while not stopping:
            for p in procs:
                if p.poll() is not None:
                    print(f"paralab: a service process exited (code {p.returncode}); "
                          "stopping", file=sys.stderr, flush=True)
                    stopping, code = True, 1
            time.sleep(0.2)
    finally:
        print("paralab: stopping...", file=sys.stderr, flush=True)
        _stop(procs, grace=max(20.0, settings.kill_grace_s + 10))
        print("paralab: stopped", file=sys.stderr, flush=True)
    return code
