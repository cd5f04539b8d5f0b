"""Issue 14, items 1, 2 and 8: every input a client can send gets a 4xx naming the field and
the rule, the same on SQLite and PostgreSQL; never a 500, never a store of what the other
database would refuse. (The races of items 7 and 8: test_inputs_races.py.)"""

from __future__ import annotations

import base64
import itertools
import json
import math

import pytest
from fastapi.testclient import TestClient

from backend import crud
from backend.core.db import get_sessionmaker
from backend.main import create_app
from backend.models import Run, RunLog
from jobs.spec import SpecError, field_docs, parse_spec

BIG = "99999999999999999999"  # > 2**64
WORKER = {"Authorization": "Bearer " + "t" * 32}  # the `settings` fixture's worker token


@pytest.fixture
def client(settings):
    # raise_server_exceptions=False: a 500 is an answer to assert on, not a test error
    with TestClient(create_app(settings), raise_server_exceptions=False) as c:
        yield c


@pytest.fixture
def run_id(client) -> str:
    r = client.post("/api/runs", json={"preset": "ddp"})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def _runs(settings) -> int:
    with get_sessionmaker(settings.db_url)() as db:
        return db.query(Run).count()


def _raw(client, method: str, path: str, text: str, headers: dict | None = None):
    """A body as the client wrote it (JSON escapes such as \\ud800, NaN literals)."""
    return client.request(method, path, content=text.encode(),
                          headers={"content-type": "application/json", **(headers or {})})


def _refused(r, loc: list, *words: str) -> None:
    assert r.status_code == 422, (r.status_code, r.text)
    detail = r.json()["detail"]
    assert any(e["loc"] == loc for e in detail), detail
    msg = next(e["msg"] for e in detail if e["loc"] == loc)
    assert all(w in msg for w in words), msg


# --- item 1: integers, cursors, presets --------------------------------------------------------

BIG_QUERIES = [
    ("/api/runs/{id}/logs?after=" + BIG, ["query", "after"]),
    ("/api/runs/{id}/logs?rank=" + BIG, ["query", "rank"]),
    ("/api/runs/{id}/logs?after=2147483648", ["query", "after"]),  # seq is an INTEGER
    ("/api/runs/{id}/logs/stream?after=" + BIG, ["query", "after"]),
    ("/api/runs/{id}/logs/stream?rank=" + BIG, ["query", "rank"]),
    ("/api/audit?before=" + BIG, ["query", "before"]),
    ("/api/audit?before=9223372036854775808", ["query", "before"]),
]


def test_integer_query_parameters_are_bounded(client, run_id):
    for path, loc in BIG_QUERIES:  # (a table, not parameters: one database each)
        _refused(client.get(path.format(id=run_id)), loc, "less than or equal")


def test_integer_path_header_and_body_fields_are_bounded(client, run_id):
    _refused(client.delete("/api/auth/tokens/" + BIG), ["path", "token_id"])
    # The SSE route checks before it answers 200: an error cannot follow the first byte.
    r = client.get(f"/api/runs/{run_id}/logs/stream", headers={"Last-Event-ID": BIG})
    _refused(r, ["header", "last-event-id"], "seq")
    r = client.post(f"/api/internal/runs/{run_id}/logs", headers=WORKER,
                    json={"lines": [{"seq": 2**31, "line": "x"}]})
    _refused(r, ["body", "lines", 0, "seq"])
    r = client.post("/api/internal/workers/heartbeat", headers=WORKER, json={
        "name": "w", "host": "h", "queue": "q", "slots": 2**40, "busy": 0})
    _refused(r, ["body", "slots"])
    r = client.post(f"/api/internal/runs/{run_id}/finish", headers=WORKER,
                    json={"status": "failed", "exit_code": 2**40})
    _refused(r, ["body", "exit_code"])


def _cursor(value) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode()


BAD_CURSORS = [
    ("-created_at", _cursor(["notadate", "x"])),
    ("-created_at", _cursor([{"dt": "notadate"}, "x"])),
    ("-created_at", _cursor([{"dt": 5}, "x"])),
    ("-created_at", _cursor([[1], "x"])),
    ("-created_at", _cursor([{"a": 1}, "x"])),
    ("-created_at", _cursor({"a": 1})),
    ("-created_at", _cursor([1, 2, 3])),
    ("-created_at", _cursor("x")),
    ("-created_at", "!!!not base64"),
    ("-created_at", _cursor([{"dt": "2026-01-01T00:00:00"}, 5])),
    ("-created_at", _cursor([{"dt": "2026-01-01T00:00:00"}, "a\u0000b"])),
    ("name", _cursor([5, "x"])),  # a number against a text column (PostgreSQL: a 500)
    ("name", _cursor(["a\u0000", "x"])),
    ("world_size", _cursor(["two", "x"])),
    ("world_size", _cursor([2.5, "x"])),
    ("world_size", _cursor([2**70, "x"])),
    ("world_size", _cursor([None, "x"])),  # not a nullable figure
    ("step_time_s", _cursor(["fast", "x"])),
    ("step_time_s", base64.urlsafe_b64encode(b'[NaN, "x"]').decode()),
]


def test_cursors_not_from_this_server_are_422_naming_cursor(client, run_id):
    for sort, cursor in BAD_CURSORS:
        r = client.get("/api/runs", params={"sort": sort, "cursor": cursor})
        _refused(r, ["query", "cursor"], "not a cursor")


def test_cursors_this_server_made_still_page_through(client):
    made = {client.post("/api/runs", json={"preset": p}).json()["id"]
            for p in ("ddp", "zero1", "dp-ps")}
    for sort in ["-created_at", "name", "world_size", "step_time_s", "-step_time_s"]:
        seen, cursor = [], None
        while True:
            page = client.get("/api/runs", params={"sort": sort, "limit": 1,
                                                   **({"cursor": cursor} if cursor else {})})
            assert page.status_code == 200, (sort, page.text)
            seen += [r["id"] for r in page.json()["items"]]
            cursor = page.json()["next_cursor"]
            if cursor is None:
                break
        assert sorted(seen) == sorted(made), sort


def test_a_huge_integer_in_a_figure_cursor_compares_as_a_number(client, settings):
    # issue 36, item 5: an integer past int64 in the cursor of a float column was bound as an
    # integer and overflowed (500 on both databases); it stands for the float it is
    rid = client.post("/api/runs", json={"preset": "ddp"}).json()["id"]
    with get_sessionmaker(settings.db_url)() as db:
        db.query(Run).filter(Run.id == rid).update(
            {"step_time_s": 0.5, "final_loss": 0.5, "duration_s": 0.5})
        db.commit()
    for sort, value in itertools.product(
            ["step_time_s", "-final_loss", "duration_s", "-duration_s"],
            (10**30, 2**63, -(2**64))):
        r = client.get("/api/runs", params={"sort": sort, "cursor": _cursor([value, "z"])})
        assert r.status_code == 200, (value, r.status_code, r.text)
        # after (descending: below) the cursor's value lies 0.5 iff the order says so
        beyond = value > 0.5 if sort.startswith("-") else value < 0.5
        assert (rid in [x["id"] for x in r.json()["items"]]) == beyond, (value, r.json())
    _refused(client.get("/api/runs", params={"sort": "step_time_s",
                                             "cursor": _cursor([10**400, "z"])}),
             ["query", "cursor"], "not a cursor")


SWEEP_BODIES = [  # (raw JSON, the loc refused): stored as they come, so refused up front
    ('{"base": {"preset": "ddp"}, "grid": {"name": ["ok", "\\ud800"]}}',
     ["body", "grid", "name", 1]),
    ('{"base": {"preset": "ddp"}, "grid": {"train.lr": [0.1, NaN]}}',
     ["body", "grid", "train.lr", 1]),
    ('{"base": {"preset": "ddp"}, "grid": {"train.lr": [0.1, 1e400]}}',
     ["body", "grid", "train.lr", 1]),
    ('{"base": {"preset": "ddp"}, "grid": {"train": [{"lr": 0.1}, {"\\udc00": 1}]}}',
     ["body", "grid", "train", 1, "(key)"]),
    ('{"base": {"preset": "ddp"}, "grid": {"name": ["ok", "a\\u0000"]}}',
     ["body", "grid", "name", 1]),
    ('{"base": {"preset": "ddp"}, "members": [{}, {"name": "\\ud800"}]}',
     ["body", "members", 1, "name"]),
    ('{"base": {"preset": "ddp", "name": "\\ud800"}, "grid": {"train.lr": [0.1]}}',
     ["body", "base", "name"]),
    ('{"base": {"preset": "ddp", "train": {"lr": NaN}}, "grid": {"train.lr": [0.1]}}',
     ["body", "base", "train", "lr"]),
]


def test_unsafe_text_or_numbers_anywhere_in_a_sweep_are_422_and_nothing_is_stored(
        client, settings):
    # issue 36, item 5: a lone surrogate was a 500 on both databases, NaN a 500 on
    # PostgreSQL and a null on SQLite (the member's overrides and the grid are stored as sent)
    for body, loc in SWEEP_BODIES:
        r = _raw(client, "POST", "/api/sweeps", body)
        assert r.status_code == 422, (body, r.status_code, r.text)
        assert any(e["loc"] == loc for e in r.json()["detail"]), (body, r.json())
        r.text.encode("utf-8")  # the answer itself is valid UTF-8 (nothing echoed raw)
    assert _runs(settings) == 0
    assert client.get("/api/sweeps").json()["items"] == []


def test_a_preset_that_is_not_a_name_is_422(client, settings):
    for preset in [["ddp"], {}, {"name": "ddp"}, 3, None]:
        _refused(client.post("/api/runs", json={"preset": preset}), ["body", "preset"],
                 "unknown preset")
    assert _runs(settings) == 0


# --- item 1: one text rule for every string ---------------------------------------------------

NUL, SURROGATE = "a\\u0000b", "a\\ud800b"  # as JSON escapes: the client sends these bytes


@pytest.mark.parametrize("bad", [NUL, SURROGATE], ids=["nul", "surrogate"])
def test_unsafe_text_in_a_submission_is_422_and_nothing_is_stored(client, settings, bad):
    for body, loc in [
            (f'{{"preset": "ddp", "name": "{bad}"}}', ["body", "name"]),
            (f'{{"preset": "ddp", "notes": "{bad}"}}', ["body", "notes"]),
            (f'{{"preset": "ddp", "tags": ["ok", "{bad}"]}}', ["body", "tags", 1]),
            (f'{{"preset": "ddp", "runtime": {{"queue": "{bad}"}}}}',
             ["body", "runtime", "queue"])]:
        r = _raw(client, "POST", "/api/runs", body)
        _refused(r, loc, "must not contain")
    # an unknown key that is itself unsafe: refused, and the answer echoing it is valid UTF-8
    r = _raw(client, "POST", "/api/runs", f'{{"preset": "ddp", "{bad}": 1}}')
    assert r.status_code == 422 and r.content.decode("utf-8")
    assert _runs(settings) == 0


@pytest.mark.parametrize("bad", [NUL, SURROGATE], ids=["nul", "surrogate"])
def test_unsafe_text_in_other_bodies_is_422(client, run_id, bad):
    cases = [
        ("PATCH", f"/api/runs/{run_id}", f'{{"name": "{bad}"}}', ["body", "name"]),
        ("PATCH", f"/api/runs/{run_id}", f'{{"notes": "{bad}"}}', ["body", "notes"]),
        ("PATCH", f"/api/runs/{run_id}", f'{{"tags": ["{bad}"]}}', ["body", "tags", 0]),
        ("POST", "/api/comparisons", f'{{"name": "{bad}", "run_ids": ["{run_id}", "x"]}}',
         ["body", "name"]),
        ("POST", "/api/comparisons", f'{{"name": "n", "run_ids": ["{run_id}", "{bad}"]}}',
         ["body", "run_ids", 1]),
        ("POST", "/api/auth/tokens", f'{{"name": "{bad}"}}', ["body", "name"]),
        ("POST", "/api/users", f'{{"username": "{bad}", "password": "long enough pw"}}',
         ["body", "username"]),
        ("POST", "/api/auth/login", f'{{"username": "{bad}", "password": "x"}}',
         ["body", "username"]),
    ]
    for method, path, body, loc in cases:
        r = _raw(client, method, path, body)
        _refused(r, loc)
        # the rule's words; pydantic's own str check finds a lone surrogate first
        assert "must not contain" in r.text or "unicode" in r.text, r.text
    r = _raw(client, "POST", f"/api/internal/runs/{run_id}/claim", f'{{"worker": "{bad}"}}',
             WORKER)
    _refused(r, ["body", "worker"])
    assert "must not contain" in r.text or "unicode" in r.text, r.text
    assert client.get(f"/api/runs/{run_id}").json()["status"] == "queued"
    # What a worker reports is made storable, never refused (it would lose the run's report)
    r = _raw(client, "POST", f"/api/internal/runs/{run_id}/finish",
             f'{{"status": "failed", "summary": {{"k{bad}": "{bad}"}}}}', WORKER)
    assert r.status_code < 500 and r.status_code != 422, r.text
    from backend.api.schemas import storable
    assert storable({"k\x00": ["a\x00b", "a\ud800b"]}) == {"k\ufffd": ["a\ufffdb", "a\\ud800b"]}


NUL_PARAMS = [
    ("/api/runs?q=a%00b", ["query", "q"]),
    ("/api/runs?owner=a%00b", ["query", "owner"]),
    ("/api/runs?tag=a%00b", ["query", "tag"]),
    ("/api/runs?status=queued,a%00b", ["query", "status"]),
    ("/api/runs/a%00b", ["path", "run_id"]),
    ("/api/runs/a%00b/logs", ["path", "run_id"]),
    ("/api/runs/a%00b/logs/stream", ["path", "run_id"]),
    ("/api/runs/a%00b/live", ["path", "run_id"]),
    ("/api/runs/a%00b/metrics", ["path", "run_id"]),
    ("/api/comparisons/a%00b", ["path", "comparison_id"]),
    ("/api/comparisons?owner=a%00b", ["query", "owner"]),
    ("/api/users/a%00b", ["path", "username"]),
    ("/api/audit?actor=a%00b", ["query", "actor"]),
    ("/api/collective-sweeps?ids=a%00b", ["query", "ids"]),
]


def test_a_nul_in_a_path_or_query_parameter_is_422(client):
    for path, loc in NUL_PARAMS:
        _refused(client.get(path), loc, "must not contain NUL")


def test_a_file_path_keeps_its_own_rule(client, run_id):
    r = client.get(f"/api/runs/{run_id}/files/a%00b")
    assert r.status_code == 400 and "NUL" in r.json()["detail"]  # storage.resolve_run_path
    r = client.put(f"/api/internal/runs/{run_id}/files/a%00b", content=b"x", headers=WORKER)
    assert r.status_code == 400 and "NUL" in r.json()["detail"]


def test_a_nul_in_a_log_line_is_stored_the_same_on_both_databases(client, settings, run_id):
    """A job's output is never refused (it would be lost): what no database holds alike is
    replaced, and the rest of the line is kept."""
    r = client.post(f"/api/internal/runs/{run_id}/logs", headers=WORKER,
                    json={"lines": [{"seq": 0, "line": "a\x00b"}]})
    assert r.status_code == 200 and r.json() == {"added": 1}
    with get_sessionmaker(settings.db_url)() as db:
        assert [x.line for x in db.query(RunLog).all()] == ["a\ufffdb"]
    # nor is a line whose time cannot be read: stored with the time it arrived, and named
    # (issue 36, item 8: the schema says "a string"; a 422 lost the whole batch)
    r = client.post(f"/api/internal/runs/{run_id}/logs", headers=WORKER,
                    json={"lines": [{"seq": 1, "line": "x", "ts": "yesterday"}]})
    assert r.status_code == 200, r.text
    assert r.json()["added"] == 1
    assert r.json()["rejected"][0]["loc"] == ["body", "lines", 0, "ts"]


# --- item 2: NaN and Infinity ------------------------------------------------------------------

FLOAT_FIELDS = [k for k, v in field_docs().items() if v["type"] == "float"]


def test_every_float_field_of_the_spec_refuses_nan_and_infinity():
    assert {"train.lr", "model.t_forward", "runtime.timeout_s", "parallel.bucket_mb"} <= \
        set(FLOAT_FIELDS)
    for name in FLOAT_FIELDS:
        section, key = name.split(".")
        for value in (math.nan, math.inf, -math.inf, 10**400):
            with pytest.raises(SpecError) as exc:
                parse_spec({"preset": "ddp", section: {key: value}})
            assert isinstance(exc.value, ValueError)
            assert exc.value.errors == [{"loc": [section, key], "type": "finite_number",
                                         "msg": "must be a finite number (NaN and Infinity "
                                                "are refused)"}], (name, value)


def test_nan_in_a_submitted_spec_is_422_and_not_stored(client, settings):
    for field in ["train.lr", "model.t_forward", "runtime.timeout_s", "parallel.bucket_mb"]:
        section, key = field.split(".")
        for literal in ["NaN", "Infinity", "-Infinity"]:
            r = _raw(client, "POST", "/api/runs",
                     f'{{"preset": "ddp", "{section}": {{"{key}": {literal}}}}}')
            _refused(r, ["body", section, key], "finite")
    assert _runs(settings) == 0


def test_nan_in_other_bodies_and_queries_is_422(client, run_id):
    whatif = ('{"params": 1000, "dp": 2, "tp": 1, "pp": 1, "zero_stage": 0, '
              '"memory_model": "16psi", "bandwidth_GBps": NaN}')
    _refused(_raw(client, "POST", "/api/predict", whatif), ["body", "bandwidth_GBps"], "finite")
    r = _raw(client, "POST", "/api/predict",
             '{"spec": {"preset": "ddp"}, "assumptions": {"compute_ms": Infinity}}')
    _refused(r, ["body", "assumptions", "compute_ms"], "finite")
    r = _raw(client, "POST", "/api/predict", '{"spec": {"preset": "ddp", "train": {"lr": NaN}}}')
    _refused(r, ["body", "spec", "train", "lr"], "finite")
    too_big = {"params": 10**400, "dp": 2, "tp": 1, "pp": 1, "zero_stage": 0,
               "memory_model": "16psi"}  # an integer no float holds: a 500 before
    _refused(client.post("/api/predict", json=too_big), ["body", "params"], "finite")
    r = client.post("/api/predict", json={**too_big, "params": 10**308})  # finite, but x16...
    _refused(r, ["body"], "inputs too large", "memory.per_rank_bytes")
    _refused(_raw(client, "POST", "/api/auth/tokens", '{"name": "t", "expires_days": NaN}'),
             ["body", "expires_days"], "finite")
    _refused(client.get("/api/runs?min_step_time_s=nan"), ["query", "min_step_time_s"],
             "finite")
    _refused(client.get("/api/runs?max_final_loss=inf"), ["query", "max_final_loss"], "finite")
    # a diverged loss a worker reports is kept as null, not refused (nor stored as NaN)
    r = _raw(client, "POST", f"/api/internal/runs/{run_id}/finish",
             '{"status": "failed", "summary": {"headline": {"final_loss": NaN}}}', WORKER)
    assert r.status_code < 500 and r.status_code != 422, r.text
    from backend.api.schemas import storable
    assert storable({"headline": {"final_loss": float("nan"), "x": 10**400}}) == \
        {"headline": {"final_loss": None, "x": None}}


# --- item 8: version 0, GET /api/auth/login, deep nesting -------------------------------------

def test_a_spec_version_below_1_is_422_naming_version(client, settings):
    for version in [0, -1, True]:
        r = client.post("/api/runs", json={"preset": "ddp", "version": version})
        assert r.status_code == 422, r.text
        assert [e["loc"] for e in r.json()["detail"]] == [["body", "version"]]
    assert _runs(settings) == 0
    assert parse_spec({"preset": "ddp", "version": 1}).version == 1


def test_get_on_the_login_endpoint_is_405_with_allow_post(client):
    r = client.get("/api/auth/login")
    assert r.status_code == 405, r.text
    assert r.headers["allow"] == "POST" and "POST" in r.json()["detail"]
    assert client.get("/api/auth/nothing-here").status_code == 404  # the catch-all still is


def test_deeply_nested_json_is_422_saying_the_limit(client, run_id):
    for body in ["[" * 100_000 + "]" * 100_000,
                 '{"preset": "ddp", "notes": ' + '{"a": ' * 50_000 + "1" + "}" * 50_000 + "}"]:
        r = _raw(client, "POST", "/api/runs", body)
        _refused(r, ["body"], "nested too deeply", "64 levels")
    # The parser's other refusals say why too (FastAPI's default: a bare 400).
    _refused(_raw(client, "POST", "/api/runs", "[" + "1" * 5000 + "]"), ["body"], "4300 digits")
    r = client.post("/api/runs", content=b'{"name": "\xff"}',
                    headers={"content-type": "application/json"})
    _refused(r, ["body"], "UTF-8")
    # Deep, but within what the parser reads: the free-form bodies have the same limit.
    deep = '{"a": ' * 100 + "1" + "}" * 100
    r = _raw(client, "POST", "/api/predict", '{"spec": {"preset": "ddp"}, "assumptions": '
                                             + deep + "}")
    assert r.status_code == 422 and "64 levels" in r.text
    r = _raw(client, "POST", f"/api/internal/runs/{run_id}/finish",
             '{"status": "failed", "summary": ' + deep + "}", WORKER)
    assert r.status_code == 422 and "64 levels" in r.text


def test_the_text_rule_is_one_definition_shared_by_the_spec_and_the_api():
    from backend.api import deps, schemas
    from jobs import spec
    assert schemas.text_problem is spec.text_problem is deps.text_problem
    assert spec.text_problem("ok é 日本") is None
    assert "NUL" in spec.text_problem("a\x00") and "surrogate" in spec.text_problem("\ud800")
    assert crud.runs.text_problem is spec.text_problem  # cursors
