"""The worker channel (/api/internal/*) takes the worker credential only: user API tokens and
session cookies of every role are refused with 401 on every internal route, and change
nothing."""

from __future__ import annotations

import re

from tests.auth.conftest import PASSWORD

ORIGIN = {"Origin": "http://testserver"}


def _fill(path: str, rid: str) -> str:
    path = path.replace("{run_id}", rid)
    path = re.sub(r"\{[^}]+:path\}", "a.txt", path)
    return re.sub(r"\{[^}]+\}", "x", path)


def _internal_routes(app) -> list[tuple[str, str]]:
    return [(m.upper(), p) for p, ops in app.openapi()["paths"].items()
            if p.startswith("/api/internal/") for m in ops]


def test_user_tokens_and_sessions_are_refused_on_every_internal_route(team_app, team, users,
                                                                      team_settings):
    tokens = {role: users.create(f"u{role}", role) for role in ("viewer", "member", "admin")}
    rid = team.post("/api/runs", json={"preset": "ddp"}, headers=tokens["member"]).json()["id"]
    routes = _internal_routes(team_app)
    assert {p for _, p in routes} >= {"/api/internal/runs/{run_id}/claim",
                                      "/api/internal/runs/{run_id}/heartbeat",
                                      "/api/internal/runs/{run_id}/logs",
                                      "/api/internal/runs/{run_id}/files/{path}",
                                      "/api/internal/runs/{run_id}/finish",
                                      "/api/internal/workers/heartbeat"}
    bodies = {"claim": {"worker": "w"}, "logs": {"lines": [{"seq": 0, "line": "forged"}]},
              "finish": {"status": "succeeded"}}
    for role, headers in tokens.items():
        for method, path in routes:
            body = next((b for k, b in bodies.items() if path.endswith(k)), {})
            r = team.request(method, _fill(path, rid), headers=headers, json=body)
            assert r.status_code == 401, (role, method, path, r.status_code)
            assert r.json() == {"detail": "worker credential required"}
    # A signed-in browser (cookie and same-origin header) is refused the same way.
    team.post("/api/auth/login", json={"username": "uadmin", "password": PASSWORD},
              headers=ORIGIN)
    for method, path in routes:
        body = next((b for k, b in bodies.items() if path.endswith(k)), {})
        assert team.request(method, _fill(path, rid), headers=ORIGIN, json=body) \
            .status_code == 401, path
    # Nothing changed: the run is still queued with no log line; the worker may still claim.
    run = team.get(f"/api/runs/{rid}", headers=tokens["admin"]).json()
    assert run["status"] == "queued"
    assert team.get(f"/api/runs/{rid}/logs", headers=tokens["admin"]).text == ""
    worker = {"Authorization": f"Bearer {team_settings.worker_token}"}
    claim = team.post(f"/api/internal/runs/{rid}/claim", json={"worker": "w"}, headers=worker)
    assert claim.status_code == 200 and claim.json()["launch"] is True
