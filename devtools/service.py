"""The real service processes the tests and the benchmarks start (`paralab serve`,
`paralab worker`, as a deployment runs them), and the databases and broker they use: the
machine's PostgreSQL server (PARALAB_TEST_PG_URL, a fresh database each) and Redis
(PARALAB_TEST_REDIS_URL)."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psycopg
from sqlalchemy.engine import make_url

from devtools.launch import free_port

PG_ADMIN_URL = os.environ.get("PARALAB_TEST_PG_URL",
                              "postgresql+psycopg://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("PARALAB_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def psycopg_dsn(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def fresh_pg_database(server_url: str) -> tuple[str, callable]:
    """A new, empty database on the server: (its URL, the function that drops it)."""
    name = f"paralab_t_{secrets.token_hex(4)}"
    with psycopg.connect(psycopg_dsn(server_url), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')

    def drop():
        with psycopg.connect(psycopg_dsn(server_url), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
    return url, drop


def wait_for(cond, timeout: float, what: str, interval: float = 0.25):
    """`cond()` once it is true. Looks again at once-short, then longer intervals (up to
    `interval` x 4): a quick condition is seen quickly, and a long wait (a sweep, a run on a
    loaded machine) does not keep the API answering four requests a second for minutes."""
    deadline = time.monotonic() + timeout
    pause = min(0.05, interval)
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(pause)
        pause = min(pause * 1.5, interval * 4)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


class Service:
    """The backend and a worker as real subprocesses, as a deployment runs them."""

    def __init__(self, tmp: Path, *, db_url: str, redis_url: str | None, extra_env=None):
        self.tmp = tmp
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.queue = f"q{secrets.token_hex(4)}"
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith("PARALAB_") and k not in ("DATABASE_URL", "REDIS_URL")}
        self.env.update({
            "PARALAB_DATA_DIR": str(tmp / "var"), "DATABASE_URL": db_url,
            "PARALAB_URL": self.url, "PARALAB_PORT": str(self.port),
            "PARALAB_QUEUE": self.queue, "PARALAB_WORKER_TOKEN": secrets.token_urlsafe(24),
            "PARALAB_RUN_HEARTBEAT_TIMEOUT_S": "8", "PARALAB_WORKER_HEARTBEAT_S": "1",
            "PARALAB_KILL_GRACE_S": "3", "OMP_NUM_THREADS": "1",
        })
        if redis_url:
            self.env["REDIS_URL"] = redis_url
        self.env.update(extra_env or {})
        self.backend: subprocess.Popen | None = None
        self.worker: subprocess.Popen | None = None
        self.http = httpx.Client(base_url=self.url, timeout=30)
        subprocess.run(self._argv("migrate"), env=self.env, check=True, cwd=tmp)

    def _argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "backend.cli", *args]

    def _spawn(self, name: str, *args: str) -> subprocess.Popen:
        log = open(self.tmp / f"{name}.log", "ab")
        return subprocess.Popen(self._argv(*args), env=self.env, cwd=self.tmp, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)

    def start_backend(self) -> None:
        self.backend = self._spawn("backend", "serve")
        wait_for(self._live, 60, "the backend to answer")

    def _live(self) -> bool:
        try:
            return self.http.get("/api/health/live", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    def start_worker(self) -> None:
        self.worker = self._spawn("worker", "worker")
        wait_for(lambda: any(w["queue"] == self.queue for w in self.http.get(
            "/api/workers").json()), 60, "the worker to report in")

    def stop(self, proc: subprocess.Popen | None, sig=signal.SIGTERM, timeout=30) -> None:
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def close(self) -> None:
        self.stop(self.worker)
        self.stop(self.backend)
        self.http.close()

    def logs(self) -> str:
        """The tail of each process's log, without the access lines of successful GETs (a
        test polling a run would fill the tail with them and hide what went wrong)."""
        def tail(p: Path) -> str:
            lines = [ln for ln in p.read_text(errors="replace").splitlines()
                     if not ('"GET ' in ln and '" 200' in ln)]
            return "\n".join(lines)[-6000:]
        return "\n".join(f"--- {p.name}\n{tail(p)}" for p in sorted(self.tmp.glob("*.log")))

    # -- API helpers ------------------------------------------------------------------------------
    def submit(self, body: dict) -> dict:
        """Submit to this fixture's own queue, so concurrent suites never take its runs."""
        body = {**body, "runtime": {**body.get("runtime", {}), "queue": self.queue}}
        r = self.http.post("/api/runs", json=body)
        assert r.status_code == 201, r.text
        return r.json()

    def run(self, run_id: str) -> dict:
        return self.http.get(f"/api/runs/{run_id}").json()

    def wait_status(self, run_id: str, statuses, timeout: float = 120) -> dict:
        """The run once its status is one of `statuses`. Woken by the run's event stream (GET
        /live: `status` and `end` events), as the CLI's --wait is, not a poll: a suite that
        polled every run it waits on spent a tenth of its CPU in the API answering GETs."""
        statuses = (statuses,) if isinstance(statuses, str) else tuple(statuses)
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            run = self.run(run_id)
            if run["status"] in statuses:
                return run
            if not self._until_status_event(run_id, statuses, left):
                time.sleep(0.25)  # the stream ended or dropped with nothing new: look again
        raise AssertionError(f"timed out after {timeout:g} s waiting for run {run_id} to reach "
                             f"{statuses}: {self.run(run_id)}\n{self.logs()}")

    def _until_status_event(self, run_id: str, statuses: tuple, limit_s: float) -> bool:
        """Read the run's /live stream until it announces one of `statuses` (True), or it
        ends, drops or `limit_s` passes (False). The stream pings every
        PARALAB_STREAM_RECHECK_S (10 s), so the read timeout is never what wakes a live run."""
        deadline = time.monotonic() + limit_s
        event = "message"
        try:
            with self.http.stream("GET", f"/api/runs/{run_id}/live",
                                  timeout=httpx.Timeout(30, read=min(limit_s, 60))) as r:
                if r.status_code != 200:
                    return False
                for line in r.iter_lines():
                    if line.startswith("event:"):
                        event = line[6:].strip()
                    elif line.startswith("data:"):
                        if event == "status" and line[5:].strip() in statuses:
                            return True
                        if event == "end":
                            return False
                    elif not line:
                        event = "message"
                    if time.monotonic() > deadline:
                        return False
        except httpx.TransportError:
            return False
        return False


@contextlib.contextmanager
def running(svc: Service, worker: bool = True):
    """`svc`'s backend (and worker) started, yielded, and stopped whatever happens."""
    try:
        svc.start_backend()
        if worker:
            svc.start_worker()
        yield svc
    finally:
        svc.close()


def embedded(tmp: Path, extra_env: dict | None = None, worker: bool = True):
    """Backend (+ worker) on the embedded default (SQLite under `tmp`, filesystem broker): what
    the tests' module fixtures and the benches run."""
    return running(Service(tmp, db_url=f"sqlite:///{tmp / 'p.db'}", redis_url=None,
                           extra_env=extra_env), worker)
