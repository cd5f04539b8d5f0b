"""`paralab up`: the whole service on one machine (what `make run` starts).

Applies migrations, starts the API/front end and one worker as children, prints the URL, and
on Ctrl-C / SIGINT / SIGTERM stops every child: the worker first (it stops its running jobs),
then the API; anything still alive after a grace period is killed with its process group.
A worker that dies (kill -9, OOM) is started again after a back-off (1, 2, 4, ... s, capped)
while the API stays up and its health says there is no worker; the API dying stops it all.
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
from paralab_core.procs import pdeathsig_preexec


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


# Back-off before restarting a worker that died: doubles per death, capped; a worker that
# lived RESTART_RESET_S starts the count again.
RESTART_FIRST_S, RESTART_MAX_S, RESTART_RESET_S = 1.0, 30.0, 60.0


class WorkerKeeper:
    """The worker child, started again with back-off whenever it exits on its own."""

    def __init__(self, env: dict):
        self.env = env
        self.proc: subprocess.Popen | None = _spawn(["worker"], env)
        self.started = time.monotonic()
        self.delay = RESTART_FIRST_S
        self.restart_at: float | None = None

    def poll(self) -> None:
        now = time.monotonic()
        if self.proc is not None and self.proc.poll() is not None:
            if now - self.started >= RESTART_RESET_S:
                self.delay = RESTART_FIRST_S
            print(f"paralab: the worker exited (code {self.proc.returncode}); starting it "
                  f"again in {self.delay:g} s (the API stays up, without a worker meanwhile)",
                  file=sys.stderr, flush=True)
            self.proc, self.restart_at = None, now + self.delay
            self.delay = min(self.delay * 2, RESTART_MAX_S)
        elif self.proc is None and self.restart_at is not None and now >= self.restart_at:
            self.proc, self.started, self.restart_at = _spawn(["worker"], self.env), now, None
            print(f"paralab: worker started again (pid {self.proc.pid})", file=sys.stderr,
                  flush=True)


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
    worker = WorkerKeeper(env)
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
            if api.poll() is not None:
                print(f"paralab: the API exited (code {api.returncode}); stopping",
                      file=sys.stderr, flush=True)
                stopping, code = True, 1
            else:
                worker.poll()
            time.sleep(0.2)
    finally:
        print("paralab: stopping...", file=sys.stderr, flush=True)
        procs = [p for p in (worker.proc, api) if p is not None]
        _stop(procs, grace=max(20.0, settings.kill_grace_s + 10))
        print("paralab: stopped", file=sys.stderr, flush=True)
    return code
