"""Shared fixtures: real databases (SQLite and the machine's PostgreSQL), real Redis, and the
real service processes (`paralab serve`, `paralab worker`) started as subprocesses."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psycopg
import pytest
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parent.parent
PG_ADMIN_URL = os.environ.get("PARALAB_TEST_PG_URL",
                              "postgresql+psycopg://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("PARALAB_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
FINISHED = ("succeeded", "failed", "cancelled", "timed_out")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _psycopg_dsn(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


@pytest.fixture(scope="session")
def pg_server_url() -> str:
    """The PostgreSQL server `make test` provisioned. Unreachable is an error, not a skip:
    the history must be tested against PostgreSQL too."""
    try:
        with psycopg.connect(_psycopg_dsn(PG_ADMIN_URL), connect_timeout=5):
            pass
    except psycopg.OperationalError as exc:
        pytest.fail(f"PostgreSQL at {PG_ADMIN_URL} is unreachable ({exc}); run `make test`, "
                    "which provisions it, or set PARALAB_TEST_PG_URL")
    return PG_ADMIN_URL


def _fresh_pg_database(server_url: str) -> tuple[str, callable]:
    name = f"paralab_t_{secrets.token_hex(4)}"
    with psycopg.connect(_psycopg_dsn(server_url), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')

    def drop():
        with psycopg.connect(_psycopg_dsn(server_url), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
    return url, drop


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path) -> str:
    """A migrated, empty database of each kind."""
    from backend.migrate import upgrade
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'paralab.db'}"
        upgrade(url)
        yield url
        return
    url, drop = _fresh_pg_database(request.getfixturevalue("pg_server_url"))
    upgrade(url)
    yield url
    from backend.core.db import get_engine
    get_engine(url).dispose()
    drop()


@pytest.fixture
def settings(tmp_path, db_url):
    from backend.core.config import Settings
    return Settings(data_dir=tmp_path / "var", database_url=db_url, worker_token="t" * 32)


@pytest.fixture
def client(settings):
    """The app in-process (FastAPI's TestClient) on the test's settings and database; a module
    that wants 500s as answers (raise_server_exceptions=False) defines its own."""
    from fastapi.testclient import TestClient

    from backend.main import create_app
    with TestClient(create_app(settings)) as c:
        yield c


# --- processes -----------------------------------------------------------------------------------

def pids_with_env(key: str, value: str) -> list[int]:
    """Every process on the machine whose environment carries key=value, including processes
    re-parented to PID 1. Written independently of worker/procs.py on purpose."""
    needle = f"{key}={value}".encode()
    pids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/environ", "rb") as f:
                    if needle in f.read().split(b"\0"):
                        pids.append(int(d))
            except OSError:
                continue
    return pids


def pids_with_run_id(run_id: str) -> list[int]:
    return pids_with_env("PARALAB_RUN_ID", run_id)


def children_of(pid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(d))
    return out


def wait_for(cond, timeout: float, what: str, interval: float = 0.25):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(interval)
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
        statuses = (statuses,) if isinstance(statuses, str) else tuple(statuses)
        try:
            return wait_for(lambda: (r := self.run(run_id))["status"] in statuses and r,
                            timeout, f"run {run_id} to reach {statuses}")
        except AssertionError:
            raise AssertionError(f"run {run_id}: {self.run(run_id)}\n{self.logs()}") from None


def embedded_service(tmp: Path, extra_env: dict | None = None):
    """Body of a fixture: backend + worker on the embedded default (SQLite, filesystem
    broker), started and stopped around the tests that share it."""
    svc = Service(tmp, db_url=f"sqlite:///{tmp / 'p.db'}", redis_url=None, extra_env=extra_env)
    try:
        svc.start_backend()
        svc.start_worker()
        yield svc
    finally:
        svc.close()


def backend_only_service(tmp: Path):
    """Body of a fixture: the backend alone (SQLite, embedded broker), no worker."""
    svc = Service(tmp, db_url=f"sqlite:///{tmp / 'p.db'}", redis_url=None)
    try:
        svc.start_backend()
        yield svc
    finally:
        svc.close()


def redis_service_body(tmp: Path, pg_server_url: str):
    """Body of a fixture: backend + worker on real Redis and a fresh PostgreSQL database."""
    url, drop = _fresh_pg_database(pg_server_url)
    svc = Service(tmp, db_url=url, redis_url=REDIS_URL)
    try:
        svc.start_backend()
        svc.start_worker()
        yield svc
    finally:
        svc.close()
        drop()


@pytest.fixture
def redis_service(tmp_path, pg_server_url):
    """Backend + worker on real Redis and real PostgreSQL (the team deployment's services)."""
    yield from redis_service_body(tmp_path, pg_server_url)


# The session-scoped reference runs of tests/analysis/conftest.py: their users share one worker.
_SESSION_RUNS = {"zero3_run", "pp_run"}
# The longest modules (`--durations`, 2026-12-06) start first, so no worker is left running one
# of them alone at the end while the others idle.
_LONGEST_FIRST = ("tests/hosts/test_presets_hosts.py", "tests/service/test_sweeps_e2e.py",
                  "tests/mp/test_train_mp.py", "tests/frontend/test_run_page_truth.py",
                  "tests/service/test_fuzz.py", "tests/frontend/test_one_figure.py",
                  "tests/frontend/test_run_figures.py", "tests/frontend/test_faults_page.py")


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (`scripts/test.sh` runs `-n N --dist loadgroup`) each module is one unit
    of work, so its module-scoped services and reference runs start once, and every user of a
    session-scoped reference run is on the same worker, which launches it once."""
    for item in items:
        if item.get_closest_marker("xdist_group"):
            continue
        uses_run = _SESSION_RUNS & set(getattr(item, "fixturenames", ()))
        group = "analysis-reference-runs" if uses_run else item.nodeid.split("::", 1)[0]
        item.add_marker(pytest.mark.xdist_group(group))
    rank = {path: i for i, path in enumerate(_LONGEST_FIRST)}
    items.sort(key=lambda it: rank.get(it.nodeid.split("::", 1)[0], len(rank)))  # stable
