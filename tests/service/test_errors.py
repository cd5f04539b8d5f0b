"""Domain errors (backend/errors.py): one handler maps each class to its status code, with
{"detail": ...} for /api and an HTML page for a missing page; one real route per mapping."""

from __future__ import annotations

import asyncio
import json

import pytest
from starlette.requests import Request

from backend import crud, services
from backend.core.db import get_sessionmaker
from backend.errors import (
    Conflict,
    DomainError,
    Forbidden,
    Invalid,
    NotFound,
    TooManyAttempts,
    Unauthorized,
    Unavailable,
    UnsafePath,
)
from backend.main import create_app
from jobs.spec import parse_spec

TABLE = [(Invalid("tags: too many"), 422), (UnsafePath("path: escapes"), 400),
         (Unauthorized("no token"), 401), (Forbidden("needs admin"), 403),
         (NotFound("no run"), 404), (Conflict("already done"), 409),
         (TooManyAttempts("slow down", retry_after_s=4), 429), (Unavailable("queue down"), 503)]



def _call_handler(app, exc: DomainError, path: str):
    request = Request({"type": "http", "method": "GET", "path": path, "headers": [],
                       "query_string": b"", "app": app})
    return asyncio.run(app.exception_handlers[DomainError](request, exc))


@pytest.mark.parametrize("exc,status", TABLE, ids=[type(e).__name__ for e, _ in TABLE])
def test_each_domain_error_maps_to_its_status_with_a_json_detail(settings, exc, status):
    resp = _call_handler(create_app(settings), exc, "/api/anything")
    assert resp.status_code == status
    body = json.loads(resp.body)
    if status == 422:  # the field and the rule, as FastAPI's own validation errors
        assert body == {"detail": [{"loc": ["body", "tags"], "msg": "tags: too many",
                                    "type": "value_error"}]}
    else:
        assert body == {"detail": str(exc)}
    if status == 401:
        assert resp.headers["www-authenticate"] == "Bearer"
    if status == 429:
        assert resp.headers["retry-after"] == "5"


def test_not_found_on_a_page_is_an_html_page(settings):
    resp = _call_handler(create_app(settings), NotFound("no run <x>"), "/runs/x")
    assert resp.status_code == 404
    assert resp.headers["content-type"].startswith("text/html")
    assert b"no run &lt;x&gt;" in resp.body and b"<x>" not in resp.body


def test_the_cli_prints_the_same_message():
    assert str(Invalid("cursor: not a cursor", where="query")) == \
        "query.cursor: cursor: not a cursor"
    assert str(Forbidden("submitting runs needs the member role")) == \
        "submitting runs needs the member role"


def _run(settings) -> str:
    with get_sessionmaker(settings.db_url)() as db:
        return crud.create_run(db, parse_spec({"preset": "ddp"}), owner="local", tags=[],
                               notes="").id


def test_invalid_422_names_the_field_and_rule(client):
    r = client.get("/api/runs", params={"cursor": "garbage"})
    assert r.status_code == 422
    assert r.json() == {"detail": [{"loc": ["query", "cursor"], "type": "value_error",
                                    "msg": "cursor: not a cursor returned by this API"}]}


def test_unsafe_path_400(client, settings):
    rid = _run(settings)
    r = client.get(f"/api/runs/{rid}/files/..%252f..%252fetc%252fpasswd")
    assert r.status_code == 400
    assert r.json()["detail"].startswith("path: ")


def test_not_found_404_json_on_api_html_on_pages(client):
    r = client.get("/api/runs/nope")
    assert r.status_code == 404 and r.json() == {"detail": "run 'nope' not found"}
    r = client.get("/no-such-page")
    assert r.status_code == 404 and r.headers["content-type"].startswith("text/html")
    assert 'id="content"' in r.text
    r = client.get("/api/no-such-route")
    assert r.status_code == 404 and r.json() == {"detail": "no API route /api/no-such-route"}


def test_conflict_409_delete_of_an_active_run(client, settings):
    rid = _run(settings)
    r = client.delete(f"/api/runs/{rid}")
    assert r.status_code == 409
    assert r.json() == {"detail": f"run {rid} is queued; cancel it first"}
    assert client.post(f"/api/runs/{rid}/cancel").status_code == 200
    r = client.post(f"/api/runs/{rid}/cancel")
    assert r.status_code == 409 and r.json() == {"detail": f"run {rid} already cancelled"}


def test_unavailable_503_when_the_queue_refuses_and_nothing_is_stored(client, monkeypatch):
    def down(*_a, **_k):
        raise ConnectionError("broker down")
    monkeypatch.setattr(services.runs, "enqueue_run", down)
    r = client.post("/api/runs", json={"preset": "ddp"})
    assert r.status_code == 503
    assert r.json() == {"detail": "the job queue is unavailable: broker down"}
    assert client.get("/api/runs").json()["items"] == []


def test_services_raise_domain_errors_not_http(settings):
    """The CLI calls the same service: it gets the domain error, with the message to print."""
    with get_sessionmaker(settings.db_url)() as db, pytest.raises(Invalid) as info:
        services.submit(db, settings, {"preset": "ddp", "tags": "x"}, owner="cli")
    assert info.value.errors[0]["loc"] == ["body", "tags"]
    assert str(info.value).startswith("body.tags: tags: must be a list")
