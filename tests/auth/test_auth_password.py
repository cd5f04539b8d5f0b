"""Password change (POST /api/auth/password): the current password is required; the new one
must pass the policy; every session of the user ends (this one too), API tokens stay
(docs/security.md, "Password change")."""

from __future__ import annotations

from fastapi.testclient import TestClient

from backend.core.db import get_sessionmaker
from backend.models import ApiToken, User
from tests.auth.conftest import PASSWORD

ORIGIN = {"Origin": "http://testserver"}
NEW = "a new and longer passphrase"


def _login(client, password=PASSWORD):
    return client.post("/api/auth/login", json={"username": "alice", "password": password},
                       headers=ORIGIN)


def test_password_change_needs_the_current_one_and_ends_every_session(team_app, team, users,
                                                                      team_settings):
    token = users.create("alice")
    other = TestClient(team_app)  # a second browser of the same user
    assert _login(team).status_code == 200 and _login(other).status_code == 200
    assert team.get("/api/auth/me").json()["via"] == "session"

    wrong = team.post("/api/auth/password", headers=ORIGIN,
                      json={"current_password": "not it at all", "new_password": NEW})
    assert wrong.status_code == 403
    assert wrong.json() == {"detail": "current password does not match"}
    weak = team.post("/api/auth/password", headers=ORIGIN,
                     json={"current_password": PASSWORD, "new_password": "abc"})
    assert weak.status_code == 422 and weak.json()["detail"][0]["loc"] == [
        "body", "new_password"]
    # Neither attempt changed anything: both sessions still work.
    assert team.get("/api/auth/me").status_code == 200
    assert other.get("/api/auth/me").status_code == 200

    ok = team.post("/api/auth/password", headers=ORIGIN,
                   json={"current_password": PASSWORD, "new_password": NEW})
    assert ok.status_code == 204
    # Every session ended, the one that made the change included; the API token stays.
    assert team.get("/api/auth/me").status_code == 401
    assert other.get("/api/auth/me").status_code == 401
    assert team.get("/api/auth/me", headers=token).json()["username"] == "alice"
    team.cookies.clear()
    assert _login(team).status_code == 401
    assert _login(team, NEW).status_code == 200
    with get_sessionmaker(team_settings.db_url)() as db:
        user = db.query(User).filter_by(username="alice").one()
        sessions = db.query(ApiToken).filter_by(user_id=user.id, kind="session").all()
        assert sum(s.revoked_at is None for s in sessions) == 1  # only the new login
        assert user.password_changed_at > user.created_at
    audit = team.get("/api/audit", headers=users.create("root", "admin"),
                     params={"action": "user.password"}).json()
    assert [(e["actor"], e["target"]) for e in audit] == [("alice", "alice")]
    other.close()


def test_password_change_with_a_token_needs_the_password_too(team, users):
    token = users.create("alice")
    r = team.post("/api/auth/password", headers=token,
                  json={"current_password": "wrong wrong", "new_password": NEW})
    assert r.status_code == 403
    r = team.post("/api/auth/password", headers=token,
                  json={"current_password": PASSWORD, "new_password": NEW})
    assert r.status_code == 204
    assert team.get("/api/auth/me", headers=token).status_code == 200  # tokens stay


def test_no_password_change_in_local_mode(settings):
    from backend.main import create_app
    with TestClient(create_app(settings)) as local:
        r = local.post("/api/auth/password",
                       json={"current_password": "x", "new_password": NEW})
        assert r.status_code == 403 and r.json() == {"detail": "current password does not match"}
