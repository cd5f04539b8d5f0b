"""What the OpenAPI schema promises and the answers keep (issue 14, item 8), checked directly
and quickly; tests/service/test_fuzz.py has schemathesis look for the cases nobody wrote down.

- every operation declares the error answers it can give (backend/errors.py's statuses, and
  the middleware's 400 / 401 / 403), once for all in backend/main.py;
- the server-sent-event routes declare text/event-stream, not JSON;
- a 405 names in `Allow` every method the path serves, not only the first route's.
"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from backend.core.config import Settings
from backend.main import create_app
from backend.migrate import upgrade

STREAMS = ("/api/runs/{run_id}/logs/stream", "/api/runs/{run_id}/live")


@pytest.fixture
def client(tmp_path):
    url = f"sqlite:///{tmp_path / 'p.db'}"
    upgrade(url)
    settings = Settings(data_dir=tmp_path / "var", database_url=url, worker_token="t" * 32)
    with TestClient(create_app(settings)) as c:
        yield c


@pytest.fixture
def schema(client) -> dict:
    return client.get("/openapi.json").json()


def _operations(schema):
    for path, ops in schema["paths"].items():
        for method, op in ops.items():
            yield path, method, op


def test_every_operation_declares_its_error_answers(schema):
    error = schema["components"]["schemas"]["Error"]
    assert error["required"] == ["detail"]
    count = 0
    for path, method, op in _operations(schema):
        codes = set(op["responses"])
        want = {"400", "401", "403", "422", "503"}
        if "{" in path:
            want.add("404")
        if method in ("post", "put", "patch", "delete"):
            want |= {"409", "429"}
        assert want <= codes, (method, path, sorted(want - codes))
        assert any(c.startswith("2") for c in codes), (method, path)
        count += 1
    assert count > 40  # the whole API, not an empty schema


def test_error_answers_match_the_declared_schema(client, schema):
    r = client.get("/api/runs/nosuchrun")
    assert r.status_code == 404 and isinstance(r.json()["detail"], str)
    declared = schema["paths"]["/api/runs/{run_id}"]["get"]["responses"]["404"]
    assert declared["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Error"}
    r = client.post("/api/runs/nosuchrun/cancel", headers={"Origin": "http://evil.example"})
    assert r.status_code == 403
    assert "403" in schema["paths"]["/api/runs/{run_id}/cancel"]["post"]["responses"]


@pytest.mark.parametrize("path", STREAMS)
def test_streams_declare_server_sent_events(schema, path):
    ok = schema["paths"][path]["get"]["responses"]["200"]
    assert list(ok["content"]) == ["text/event-stream"]
    item = ok["content"]["text/event-stream"]["itemSchema"]
    assert item["required"] == ["event", "data"] and "end" in item["properties"]["event"]["enum"]


def test_a_stream_answers_what_it_declares(client):
    run = client.post("/api/runs", json={"preset": "ddp"}).json()
    assert client.post(f"/api/runs/{run['id']}/cancel").status_code == 200
    r = client.get(f"/api/runs/{run['id']}/live")  # a finished run: status, then end
    assert r.headers["content-type"].startswith("text/event-stream")
    assert "event: end" in r.text


@pytest.mark.parametrize("method, path, allow", [
    ("OPTIONS", "/api/runs", "GET, HEAD, POST"),
    ("PUT", "/api/runs/abc", "DELETE, GET, HEAD, PATCH"),
    ("OPTIONS", "/api/runs/abc/star", "DELETE, PUT"),
    ("PATCH", "/api/comparisons", "GET, HEAD, POST"),
    ("PUT", "/api/users/alice", "GET, HEAD, PATCH"),
])
def test_method_not_allowed_names_every_method_of_the_path(client, schema, method, path, allow):
    r = client.request(method, path)
    assert r.status_code == 405, r.text
    assert r.headers["allow"] == allow
    # ... which are the methods the schema declares there (HEAD comes with GET)
    template = path.replace("abc", "{run_id}").replace("alice", "{username}")
    declared = {m.upper() for m in schema["paths"][template]}
    assert set(allow.split(", ")) - {"HEAD"} == declared
