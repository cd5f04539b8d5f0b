"""Local mode (the embedded default): no login, one implicit admin `local`, loopback only; and
the start-up refusals of both modes, through the real `paralab` command."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from fastapi.testclient import TestClient

from backend.main import create_app
from tests.conftest import ROOT


@pytest.fixture
def local(settings):
    with TestClient(create_app(settings)) as c:
        yield c


def test_local_mode_needs_no_login_and_acts_as_local_admin(local):
    me = local.get("/api/auth/me").json()
    assert (me["username"], me["role"], me["mode"]) == ("local", "admin", "local")
    run = local.post("/api/runs", json={"preset": "ddp"}).json()
    assert run["owner"] == "local" and run["can_modify"] is True
    assert local.put(f"/api/runs/{run['id']}/star").json()["starred"] is True
    assert local.get("/api/runs").json()["items"][0]["starred"] is True
    assert local.post(f"/api/runs/{run['id']}/cancel").json()["status"] == "cancelled"
    assert local.delete(f"/api/runs/{run['id']}").status_code == 204
    assert local.get("/", follow_redirects=False).status_code == 200
    assert local.get("/login", follow_redirects=False).headers["location"] == "/"
    assert [e["action"] for e in local.get("/api/audit").json()] == \
        ["run.delete", "run.cancel", "run.submit"]
    assert local.get("/api/runs").headers["x-content-type-options"] == "nosniff"


def test_local_mode_refuses_cross_site_writes(local):
    body = {"preset": "ddp"}
    assert local.post("/api/runs", json=body,
                      headers={"Origin": "https://evil.example"}).status_code == 403
    assert local.post("/api/runs", json=body,
                      headers={"Origin": "http://testserver"}).status_code == 201
    assert local.post("/api/runs", json=body).status_code == 201  # CLI, scripts: no Origin


def _paralab(tmp_path, *args, **env) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("PARALAB_") and k not in ("DATABASE_URL", "REDIS_URL")}
    base.update({"PARALAB_DATA_DIR": str(tmp_path / "var"), **env})
    return subprocess.run([sys.executable, "-m", "backend.cli", *args], env=base, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def test_serve_refuses_unsafe_configurations(tmp_path):
    r = _paralab(tmp_path, "serve", "--host", "0.0.0.0", "--port", "1")
    assert r.returncode == 2 and "loopback" in r.stderr and "PARALAB_AUTH=required" in r.stderr
    r = _paralab(tmp_path, "up", "--host", "192.168.1.10", "--port", "1")
    assert r.returncode == 2 and "loopback" in r.stderr
    # Weak keys are covered in-process (test_team_mode_refuses_weak_or_missing_secret).
    r = _paralab(tmp_path, "serve", "--port", "1", PARALAB_AUTH="required",
                 PARALAB_SECRET_KEY="changeme")
    assert r.returncode == 2 and "PARALAB_SECRET_KEY" in r.stderr, r.stderr
    assert not (tmp_path / "var" / "paralab.db").exists()  # refused before touching anything


def test_migration_0003_goes_down_and_up(db_url):
    from alembic import command
    from sqlalchemy import inspect

    from backend.core.db import make_engine
    from backend.migrate import alembic_config, upgrade
    command.downgrade(alembic_config(db_url), "0002")
    engine = make_engine(db_url)
    assert "users" not in inspect(engine).get_table_names()
    upgrade(db_url)
    tables = set(inspect(engine).get_table_names())
    engine.dispose()
    assert {"users", "api_tokens", "audit_log", "stars", "saved_comparisons", "runs"} <= tables
