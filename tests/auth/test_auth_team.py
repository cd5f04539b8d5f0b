"""Team mode (PARALAB_AUTH=required), in-process against SQLite and PostgreSQL: every API route
needs credentials (generated from the OpenAPI schema), pages redirect to /login, roles,
per-user limits, tokens, sessions, CSRF (Origin) and login throttling."""

from __future__ import annotations

import re
from datetime import datetime

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from starlette.routing import Route

from backend.api.middleware import PUBLIC_API
from backend.core.db import get_sessionmaker
from backend.models import ApiToken
from tests.auth.conftest import PASSWORD

ORIGIN = {"Origin": "http://testserver"}
EXPECTED_PUBLIC = {("POST", "/api/auth/login"), ("GET", "/api/health/live")}


def _fill(path: str) -> str:
    path = re.sub(r"\{[^}]+:path\}", "a.txt", path)
    return re.sub(r"\{[^}]+\}", "x", path)


def test_every_api_route_without_credentials_is_401_except_the_public_list(team_app, team):
    schema = team_app.openapi()
    seen, open_routes = 0, set()
    for path, ops in schema["paths"].items():
        for method in ops:
            if method.upper() not in ("GET", "POST", "PUT", "PATCH", "DELETE"):
                continue
            seen += 1
            r = team.request(method.upper(), _fill(path))
            if r.status_code != 401:
                open_routes.add((method.upper(), path))
            elif not path.startswith("/api/internal/"):
                assert r.headers.get("www-authenticate") == "Bearer", path
    assert seen > 30  # the whole schema, not a hand-picked list
    assert open_routes == EXPECTED_PUBLIC == set(PUBLIC_API)
    # Routes outside the schema too: unknown API paths, HEAD, the worker channel's root.
    for method, path in (("GET", "/api/nope"), ("POST", "/api/nope"), ("GET", "/api"),
                         ("HEAD", "/api/runs"), ("GET", "/api/internal")):
        assert team.request(method, path).status_code == 401, (method, path)


def _routes(routes, prefix: str = ""):
    """Every route, through included routers (FastAPI keeps those as nested objects)."""
    for r in routes:
        inner = getattr(r, "original_router", None)
        if inner is not None:
            yield from _routes(inner.routes, prefix + r.include_context.prefix)
        elif isinstance(r, (APIRoute, Route)):
            yield prefix + r.path, r


def test_every_page_redirects_to_login(team_app, team):
    pages = {path for path, r in _routes(team_app.routes) if "GET" in (r.methods or ())
             and not path.startswith(("/api", "/static")) and path != "/login"}
    assert {"/", "/new", "/runs/{run_id}", "/compare", "/collectives", "/schedules", "/docs",
            "/openapi.json"} <= pages
    for page in sorted(pages) + ["/no-such-page", "/runs/abc?tab=log"]:
        r = team.get(_fill(page), follow_redirects=False)
        assert r.status_code == 303, (page, r.status_code)
        assert r.headers["location"].startswith("/login?next=%2F"), r.headers["location"]
    assert team.get("/runs/abc?tab=log", follow_redirects=False).headers["location"] == \
        "/login?next=%2Fruns%2Fabc%3Ftab%3Dlog"
    login = team.get("/login")
    assert login.status_code == 200 and 'id="login-form"' in login.text
    assert "frame-ancestors 'none'" in login.headers["content-security-policy"]
    assert team.get("/static/js/login.js").status_code == 200
    assert team.get("/static/css/app.css").status_code == 200


def test_roles_viewer_member_admin(team, users):
    viewer, alice, bob = users.create("vera", "viewer"), users.create("alice"), \
        users.create("bob")
    admin = users.create("root", "admin")
    r = team.post("/api/runs", json={"preset": "ddp"}, headers=viewer)
    assert r.status_code == 403 and "member" in r.json()["detail"]
    run = team.post("/api/runs", json={"preset": "ddp", "name": "alice's"}, headers=alice)
    assert run.status_code == 201, run.text
    run = run.json()
    assert run["owner"] == "alice" and run["can_modify"] is True
    rid = run["id"]
    # Everyone reads everything; only the owner and admins may change it.
    for who in (viewer, bob, admin):
        got = team.get(f"/api/runs/{rid}", headers=who)
        assert got.status_code == 200 and got.json()["owner"] == "alice"
    listed = {r["id"]: r for r in team.get("/api/runs", headers=bob).json()["items"]}
    assert listed[rid]["can_modify"] is False
    assert team.get("/api/runs", headers=admin).json()["items"][0]["can_modify"] is True
    for who in (viewer, bob):
        assert team.post(f"/api/runs/{rid}/cancel", headers=who).status_code == 403
        assert team.patch(f"/api/runs/{rid}", json={"notes": "x"}, headers=who).status_code \
            == 403
        assert team.delete(f"/api/runs/{rid}", headers=who).status_code == 403
    r = team.post(f"/api/runs/{rid}/cancel", headers=bob)
    assert "alice" in r.json()["detail"] and "admin" in r.json()["detail"]
    # The owner edits; the admin cancels and deletes.
    assert team.patch(f"/api/runs/{rid}", json={"tags": ["x"]}, headers=alice).json()[
        "tags"] == ["x"]
    assert team.delete(f"/api/runs/{rid}", headers=admin).status_code == 409  # still queued
    assert team.post(f"/api/runs/{rid}/cancel", headers=admin).json()["status"] == "cancelled"
    assert team.delete(f"/api/runs/{rid}", headers=admin).status_code == 204
    assert team.get(f"/api/runs/{rid}", headers=admin).status_code == 404
    # A member deletes their own finished run.
    own = team.post("/api/runs", json={"preset": "ddp"}, headers=bob).json()["id"]
    team.post(f"/api/runs/{own}/cancel", headers=bob)
    assert team.delete(f"/api/runs/{own}", headers=bob).status_code == 204
    # Users and the audit log are the admin's.
    assert team.get("/api/users", headers=bob).status_code == 403
    assert team.get("/api/audit", headers=viewer).status_code == 403
    assert team.post("/api/users", json={"username": "eve", "password": PASSWORD},
                     headers=alice).status_code == 403
    assert team.patch("/api/users/bob", json={"role": "admin"}, headers=bob).status_code == 403
    assert {u["username"] for u in team.get("/api/users", headers=admin).json()} == \
        {"vera", "alice", "bob", "root"}


def test_per_user_limits_at_submit(team, users):
    small = users.create("small", max_world_size=1)
    one = users.create("one", max_concurrent_runs=1)
    r = team.post("/api/runs", json={"preset": "ddp"}, headers=small)  # world size 2
    assert r.status_code == 403 and "max_world_size=1" in r.json()["detail"]
    assert "world size 2" in r.json()["detail"]
    first = team.post("/api/runs", json={"preset": "ddp"}, headers=one)
    assert first.status_code == 201
    r = team.post("/api/runs", json={"preset": "ddp"}, headers=one)
    assert r.status_code == 403 and "max_concurrent_runs=1" in r.json()["detail"]
    team.post(f"/api/runs/{first.json()['id']}/cancel", headers=one)
    assert team.post("/api/runs", json={"preset": "ddp"}, headers=one).status_code == 201
    me = team.get("/api/auth/me", headers=one).json()
    assert me["max_concurrent_runs"] == 1 and me["role"] == "member" and me["can_submit"]


def test_tokens_shown_once_hashed_last_used_and_revoked_at_once(team, users, team_settings):
    alice = users.create("alice")
    made = team.post("/api/auth/tokens", json={"name": "laptop"}, headers=alice)
    assert made.status_code == 201
    token, tid = made.json()["token"], made.json()["id"]
    bearer = {"Authorization": f"Bearer {token}"}
    with get_sessionmaker(team_settings.db_url)() as db:
        row = db.get(ApiToken, tid)
        assert token not in (row.token_hash, row.prefix) and len(row.token_hash) == 64
        assert row.last_used_at is None
    assert team.get("/api/auth/me", headers=bearer).json()["username"] == "alice"
    with get_sessionmaker(team_settings.db_url)() as db:
        used = db.get(ApiToken, tid).last_used_at
    listed = {t["id"]: t for t in team.get("/api/auth/tokens", headers=alice).json()}
    # The first use is recorded (its time, as stored); the listing shows exactly that.
    assert used >= row.created_at and "token" not in listed[tid]
    assert datetime.fromisoformat(listed[tid]["last_used_at"]).replace(tzinfo=None) == \
        used.replace(tzinfo=None)
    assert token not in team.get("/api/auth/tokens", headers=alice).text
    assert team.delete(f"/api/auth/tokens/{tid}", headers=alice).status_code == 204
    assert team.get("/api/auth/me", headers=bearer).status_code == 401
    assert team.get("/api/runs", headers=bearer).status_code == 401
    # Someone else's token is not yours to revoke (404, not a hint that it exists).
    other = team.post("/api/auth/tokens", json={"name": "x"}, headers=alice).json()["id"]
    bob = users.create("bob")
    assert team.delete(f"/api/auth/tokens/{other}", headers=bob).status_code == 404
    for bad in ("Bearer plt_nope", "Bearer ", "Basic YWxpY2U6eA==", "Bearer " + "w" * 40):
        assert team.get("/api/runs", headers={"Authorization": bad}).status_code == 401, bad


def test_worker_and_user_credentials_do_not_cross(team, users, team_settings):
    alice = users.create("alice")
    worker = {"Authorization": f"Bearer {team_settings.worker_token}"}
    for path in ("/api/runs", "/api/users", "/api/auth/me", "/api/auth/tokens"):
        assert team.get(path, headers=worker).status_code == 401, path
    assert team.post("/api/users", json={"username": "w", "password": PASSWORD},
                     headers=worker).status_code == 401
    rid = team.post("/api/runs", json={"preset": "ddp"}, headers=alice).json()["id"]
    assert team.post(f"/api/internal/runs/{rid}/heartbeat", headers=alice).status_code == 401
    assert team.post(f"/api/internal/runs/{rid}/claim", json={"worker": "w"},
                     headers=worker).json()["launch"] is True
    # A browser session is not a worker credential either.
    assert team.post("/api/auth/login", json={"username": "alice", "password": PASSWORD},
                     headers=ORIGIN).status_code == 200
    assert team.post(f"/api/internal/runs/{rid}/heartbeat", headers=ORIGIN).status_code == 401


def test_session_cookie_csrf_origin_check_and_logout(team, users):
    users.create("alice")
    r = team.post("/api/auth/login", json={"username": "alice", "password": PASSWORD})
    assert r.status_code == 200 and r.json()["role"] == "member"
    cookie = r.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
    assert team.get("/api/auth/me").json()["via"] == "session"
    assert team.get("/", follow_redirects=False).status_code == 200
    # Cookie-authenticated writes need a same-origin Origin (or Referer).
    body = {"preset": "ddp"}
    assert team.post("/api/runs", json=body).status_code == 403
    assert team.post("/api/runs", json=body, headers={"Origin": "https://evil.example"}) \
        .status_code == 403
    assert team.post("/api/runs", json=body, headers={"Origin": "null"}).status_code == 403
    assert team.post("/api/runs", json=body,
                     headers={"Referer": "http://evil.example/http://testserver/"}) \
        .status_code == 403
    assert team.post("/api/runs", json=body, headers={"Origin": "http://testserver:81"}) \
        .status_code == 403
    ok = team.post("/api/runs", json=body, headers=ORIGIN)
    assert ok.status_code == 201 and ok.json()["owner"] == "alice"
    rid = ok.json()["id"]
    assert team.post(f"/api/runs/{rid}/cancel",
                     headers={"Referer": "http://testserver/runs/x"}).status_code == 200
    # Logout ends the session on the server: the old cookie no longer works.
    old = dict(team.cookies)
    assert team.post("/api/auth/logout").status_code == 403  # CSRF applies to logout too
    assert team.post("/api/auth/logout", headers=ORIGIN).status_code == 204
    team.cookies.clear()
    assert team.get("/api/auth/me").status_code == 401
    team.cookies.update(old)
    assert team.get("/api/auth/me").status_code == 401
    # A forged or unsigned cookie is not a session.
    team.cookies.clear()
    team.cookies.set("paralab_session", "pls_forged.0123456789abcdef0123456789abcdef")
    assert team.get("/api/auth/me").status_code == 401


def test_login_failures_are_uniform_and_throttled(team, users):
    users.create("alice")
    wrong = team.post("/api/auth/login", json={"username": "alice", "password": "nope nope"})
    ghost = team.post("/api/auth/login", json={"username": "ghost", "password": "nope nope"})
    assert wrong.status_code == ghost.status_code == 401
    assert wrong.json() == ghost.json() == {"detail": "invalid username or password"}
    for _ in range(9):  # ten failures in all for alice
        assert team.post("/api/auth/login", json={"username": "alice", "password": "x"}) \
            .status_code == 401
    r = team.post("/api/auth/login", json={"username": "alice", "password": PASSWORD})
    assert r.status_code == 429 and int(r.headers["retry-after"]) > 0
    # Throttling of a name that does not exist looks the same.
    for _ in range(10):
        team.post("/api/auth/login", json={"username": "nobody", "password": "x"})
    assert team.post("/api/auth/login", json={"username": "nobody", "password": "x"}) \
        .status_code == 429
    assert team.post("/api/auth/login", json={"username": "alice", "password": "x"}, headers={
        "Origin": "https://evil.example"}).status_code == 403


def test_deactivated_user_and_password_change_end_access(team, users):
    admin = users.create("root", "admin")
    bob = users.create("bob")
    assert team.get("/api/auth/me", headers=bob).status_code == 200
    assert team.patch("/api/users/bob", json={"is_active": False},
                      headers=admin).status_code == 200
    assert team.get("/api/auth/me", headers=bob).status_code == 401
    assert team.post("/api/auth/login", json={"username": "bob", "password": PASSWORD}) \
        .status_code == 401
    assert team.patch("/api/users/root", json={"role": "member"}, headers=admin).status_code \
        == 409
    r = team.post("/api/users", json={"username": "Bad Name", "password": PASSWORD},
                  headers=admin)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "username"]
    r = team.post("/api/users", json={"username": "short", "password": "abc"}, headers=admin)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "password"]
    assert team.post("/api/users", json={"username": "bob", "password": PASSWORD},
                     headers=admin).status_code == 422  # taken


def test_team_mode_refuses_weak_or_missing_secret(tmp_path):
    from backend.core.config import Settings
    from backend.core.security import ConfigError
    from backend.main import create_app
    for key in (None, "", "changeme", "secret", "dev", "x" * 40, "short-but-random-9f8a"):
        s = Settings(data_dir=tmp_path, auth="required", secret_key=key, worker_token="w" * 32)
        with pytest.raises(ConfigError, match="PARALAB_SECRET_KEY"):
            create_app(s)


def test_a_fresh_client_has_no_ambient_identity(team_app, users):
    users.create("alice")
    with TestClient(team_app) as other:
        assert other.get("/api/runs").status_code == 401
