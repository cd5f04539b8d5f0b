"""Shared fixtures: real databases (SQLite and the machine's PostgreSQL), real Redis, and the
real service processes (`paralab serve`, `paralab worker`) started as subprocesses."""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path

import psycopg
import pytest

# The harness shared with bench/ (devtools/), under the names the tests import from here.
from devtools.launch import ROOT as ROOT
from devtools.launch import free_port as free_port
from devtools.service import PG_ADMIN_URL, REDIS_URL, Service, embedded, running
from devtools.service import fresh_pg_database as _fresh_pg_database
from devtools.service import psycopg_dsn as _psycopg_dsn
from devtools.service import wait_for as wait_for

FINISHED = ("succeeded", "failed", "cancelled", "timed_out")


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


def embedded_service(tmp: Path, extra_env: dict | None = None):
    """Body of a fixture: backend + worker on the embedded default (SQLite, filesystem
    broker), started and stopped around the tests that share it."""
    with embedded(tmp, extra_env) as svc:
        yield svc


def backend_only_service(tmp: Path):
    """Body of a fixture: the backend alone (SQLite, embedded broker), no worker."""
    with embedded(tmp, worker=False) as svc:
        yield svc


def redis_service_body(tmp: Path, pg_server_url: str):
    """Body of a fixture: backend + worker on real Redis and a fresh PostgreSQL database."""
    url, drop = _fresh_pg_database(pg_server_url)
    try:
        with running(Service(tmp, db_url=url, redis_url=REDIS_URL)) as svc:
            yield svc
    finally:
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


# PARALAB_TEST_CPU_REPORT=FILE: one JSON line per test with the CPU seconds its setup, call and
# teardown cost this pytest process and every child it reaped (services, workers and the jobs
# they reaped; a module-scoped service lands on the module's last test). Where CI time goes:
# `python scripts/test_cpu.py FILE` sums it by module (docs/testing.md).
_CPU_REPORT = os.environ.get("PARALAB_TEST_CPU_REPORT")


def _cpu_s() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(
        resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not _CPU_REPORT:
        yield
        return
    c0, t0 = _cpu_s(), time.monotonic()
    yield
    with open(_CPU_REPORT, "a") as f:  # one short append per test: lines never interleave
        f.write(json.dumps({"test": item.nodeid, "cpu_s": round(_cpu_s() - c0, 3),
                            "wall_s": round(time.monotonic() - t0, 3)}) + "\n")
