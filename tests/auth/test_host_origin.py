"""DNS rebinding and cross-site writes (issue 14, item 5; docs/security.md).

A web page at http://evil.example:8100 whose name is made to resolve to 127.0.0.1 talks to a
local paralab as "same origin" from the browser's point of view: it sends `Host:` and `Origin:`
of its own name. The Host allow-list refuses it (400) before anything else; a write whose
Origin/Referer is not this server is refused (403) in both modes; the worker channel and the
CLI (no Origin) keep working.

The in-app tests call the app with a client address of 127.0.0.1 (as uvicorn would put it in
the scope), so the Host check applies as it does behind a real socket; one test runs the real
`paralab serve` and `paralab` CLI.
"""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest
from fastapi.testclient import TestClient

from backend.core.config import Settings
from backend.main import create_app
from backend.migrate import upgrade
from tests.auth.conftest import FAST_ARGON2, PASSWORD, SECRET, Users
from tests.conftest import ROOT, Service

ATTACK = {"Host": "evil.example:8100", "Origin": "http://evil.example:8100"}
SOCKET = ("127.0.0.1", 50000)  # what uvicorn puts in scope["client"]
WORKER = "w" * 40


def _settings(tmp_path, **kw) -> Settings:
    url = f"sqlite:///{tmp_path / 'p.db'}"
    upgrade(url)
    return Settings(data_dir=tmp_path / "var", database_url=url, worker_token=WORKER, **kw)


def _client(settings: Settings, base_url: str = "http://127.0.0.1:8100") -> TestClient:
    return TestClient(create_app(settings), base_url=base_url, client=SOCKET)


def _team(tmp_path, **kw) -> Settings:
    return _settings(tmp_path, auth="required", secret_key=SECRET, **FAST_ARGON2, **kw)


# --- local mode -------------------------------------------------------------------------------

def test_local_mode_refuses_the_rebinding_attack(tmp_path):
    with _client(_settings(tmp_path)) as c:
        r = c.post("/api/runs", json={"preset": "ddp"}, headers=ATTACK)
        assert r.status_code == 400, r.text
        assert "evil.example:8100" in r.json()["detail"] and "loopback" in r.json()["detail"]
        # Reads too: a rebinding page could otherwise read the history.
        for path in ("/api/runs", "/api/auth/me", "/", "/openapi.json"):
            r = c.get(path, headers={"Host": "evil.example:8100"})
            assert r.status_code == 400, (path, r.status_code)
        assert c.get("/api/runs").json()["items"] == []  # nothing was stored


@pytest.mark.parametrize("host", ["127.0.0.1:8100", "localhost:1234", "[::1]:8000",
                                  "localhost", "127.0.0.1"])
def test_local_mode_answers_loopback_names_on_any_port(tmp_path, host):
    with _client(_settings(tmp_path)) as c:
        assert c.get("/api/auth/me", headers={"Host": host}).status_code == 200
        origin = {"Host": host, "Origin": f"http://{host}"}
        assert c.post("/api/runs", json={"preset": "ddp"}, headers=origin).status_code == 201


@pytest.mark.parametrize("host", ["evil.example", "127.0.0.1.evil.example:8100", "10.0.0.5",
                                  "0.0.0.0:8100", "", "user@127.0.0.1", "127.0.0.1:99999"])
def test_local_mode_refuses_other_hosts(tmp_path, host):
    with _client(_settings(tmp_path)) as c:
        assert c.get("/api/runs", headers={"Host": host}).status_code == 400


def test_local_mode_ignores_allowed_hosts(tmp_path):
    # Local mode has no accounts: the allow-list setting is for team mode only.
    with _client(_settings(tmp_path, allowed_hosts="evil.example,*")) as c:
        assert c.get("/api/runs", headers={"Host": "evil.example:8100"}).status_code == 400


@pytest.mark.parametrize("headers", [
    {"Origin": "http://evil.example:8100"},
    {"Origin": "http://localhost:8100"},          # another name: another origin
    {"Origin": "http://127.0.0.1:9999"},          # another port: another local app
    {"Origin": "null"},
    {"Referer": "http://evil.example:8100/page"},
])
def test_local_mode_refuses_cross_site_writes_with_words(tmp_path, headers):
    with _client(_settings(tmp_path)) as c:
        for method, path in (("POST", "/api/runs"), ("POST", "/api/comparisons"),
                             ("DELETE", "/api/runs/abc"), ("PATCH", "/api/runs/abc")):
            r = c.request(method, path, json={"preset": "ddp"}, headers=headers)
            assert r.status_code == 403, (method, path, r.text)
            assert "cross-site request refused" in r.json()["detail"]
        # Reads are not writes: the page could not read the answer anyway (no CORS).
        assert c.get("/api/runs", headers=headers).status_code == 200
        assert c.get("/api/runs").json()["items"] == []


def test_local_mode_accepts_same_origin_and_no_origin(tmp_path):
    with _client(_settings(tmp_path)) as c:
        same = {"Origin": "http://127.0.0.1:8100"}
        assert c.post("/api/runs", json={"preset": "ddp"}, headers=same).status_code == 201
        ref = {"Referer": "http://127.0.0.1:8100/runs"}
        assert c.post("/api/runs", json={"preset": "ddp"}, headers=ref).status_code == 201
        assert c.post("/api/runs", json={"preset": "ddp"}).status_code == 201  # CLI, scripts


@pytest.mark.parametrize("team", [False, True])
def test_worker_channel_is_exempt_from_the_host_check(tmp_path, team):
    # Workers may reach the backend by an internal name; the channel needs the worker token.
    settings = _team(tmp_path, url="https://paralab.example.org") if team else _settings(tmp_path)
    beat = {"name": "w1", "host": "h", "queue": "q", "slots": 1, "busy": 0}
    with _client(settings) as c:
        host = {"Host": "backend:8000"}
        r = c.post("/api/internal/workers/heartbeat", json=beat, headers=host)
        assert r.status_code == 401
        host["Authorization"] = f"Bearer {WORKER}"
        r = c.post("/api/internal/workers/heartbeat", json=beat, headers=host)
        assert r.status_code == 200, r.text


# --- team mode --------------------------------------------------------------------------------

def test_team_mode_refuses_foreign_hosts_even_with_a_token(tmp_path):
    settings = _team(tmp_path, url="https://paralab.example.org")
    token = Users(settings).create("alice", "admin")
    with _client(settings) as c:
        r = c.post("/api/runs", json={"preset": "ddp"}, headers={**ATTACK, **token})
        assert r.status_code == 400 and "PARALAB_ALLOWED_HOSTS" in r.json()["detail"]
        r = c.post("/api/auth/login", json={"username": "alice", "password": PASSWORD},
                   headers=ATTACK)
        assert r.status_code == 400
        # The host of PARALAB_URL (any port) and loopback names are served.
        for host in ("paralab.example.org", "paralab.example.org:443", "127.0.0.1:8000"):
            assert c.get("/api/auth/me", headers={"Host": host, **token}).status_code == 200


def test_team_mode_allowed_hosts_setting(tmp_path):
    settings = _team(tmp_path, url="https://ignored.example",
                     allowed_hosts=" a.example:8443 , B.example,[fd00::1]")
    token = Users(settings).create("alice", "admin")
    with _client(settings) as c:
        def status(host):
            return c.get("/api/auth/me", headers={"Host": host, **token}).status_code
        assert [status(h) for h in ("a.example:8443", "b.example:1", "[fd00::1]:80",
                                    "localhost:8000")] == [200] * 4
        assert [status(h) for h in ("a.example:80", "a.example", "ignored.example",
                                    "evil.example")] == [400] * 4


def test_team_mode_without_a_public_host_answers_any_host(tmp_path):
    # Neither PARALAB_ALLOWED_HOSTS nor PARALAB_URL: every request is authenticated anyway,
    # and the session cookie is bound to the name the user signed in at.
    for kw in ({}, {"allowed_hosts": "*", "url": "https://paralab.example.org"}):
        (tmp_path / str(len(kw))).mkdir()
        settings = _team(tmp_path / str(len(kw)), **kw)
        token = Users(settings).create("alice", "admin")
        with _client(settings) as c:
            r = c.get("/api/auth/me", headers={"Host": "whatever.example", **token})
            assert r.status_code == 200, kw


def test_team_mode_cookie_writes_need_this_origin(tmp_path):
    settings = _team(tmp_path, url="https://paralab.example.org")
    Users(settings).create("alice", "member")
    with _client(settings, base_url="http://paralab.example.org") as c:
        same = {"Origin": "http://paralab.example.org"}
        login = {"username": "alice", "password": PASSWORD}
        assert c.post("/api/auth/login", json=login, headers=same).status_code == 200
        for bad in ({"Origin": "http://evil.example:8100"}, {"Origin": "null"}, {}):
            r = c.post("/api/runs", json={"preset": "ddp"}, headers=bad)
            assert r.status_code == 403 and "cross-site" in r.json()["detail"], bad
        assert c.post("/api/runs", json={"preset": "ddp"}, headers=same).status_code == 201


# --- the real service and CLI -----------------------------------------------------------------

def test_real_service_refuses_the_attack_and_serves_the_cli(tmp_path):
    svc = Service(tmp_path, db_url=f"sqlite:///{tmp_path / 'p.db'}", redis_url=None)
    try:
        svc.start_backend()  # no worker: the runs stay queued
        r = httpx.post(f"{svc.url}/api/runs", json={"preset": "ddp"}, headers=ATTACK)
        assert r.status_code == 400, r.text
        # The TestClient's in-process name is no way in over a socket, proxy headers or not.
        fake = {"Host": "testserver", "X-Forwarded-For": "testclient"}
        assert httpx.get(f"{svc.url}/api/runs", headers=fake).status_code == 400
        assert svc.http.get("/api/runs").json()["items"] == []
        env = {**svc.env, "PYTHONPATH": os.pathsep.join(filter(None, [
            str(ROOT), os.environ.get("PYTHONPATH")]))}
        cli = subprocess.run([sys.executable, "-m", "backend.cli", "submit", "--preset", "ddp"],
                             env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert cli.returncode == 0, cli.stderr
        assert len(svc.http.get("/api/runs").json()["items"]) == 1
    finally:
        svc.close()
