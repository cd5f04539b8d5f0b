"""Issue 36, item 9: nothing a worker sends breaks a page, a failed run says why in words, the
files of a failed atomic write are not run files, an unmigrated database says so, and the
schema states the text rule the routes enforce.

Trace files and summary.json reach the backend through the worker channel (any holder of the
worker credential may send them), so the loader treats them as input: a field of the wrong
shape is dropped with a warning, never a 500 (jobs/analysis/storage/load.py, jsonl.py)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient

from backend.core.config import Settings
from backend.main import create_app
from backend.migrate import upgrade
from jobs.analysis.storage.load import load_run_dir
from tests.analysis import synth as S

WORKER = {"Authorization": "Bearer " + "t" * 32}  # the `settings` fixture's worker token
PAGES = ["gantt", "gantt/steps", "gantt?step=0", "metrics", "export?format=json"]


@pytest.fixture
def settings(tmp_path):
    # SQLite only: what is tested lives in the run's files, not in the database
    url = f"sqlite:///{tmp_path / 'p.db'}"
    upgrade(url)
    return Settings(data_dir=tmp_path / "var", database_url=url, worker_token="t" * 32)


@pytest.fixture
def client(settings):
    with TestClient(create_app(settings), raise_server_exceptions=False) as c:
        yield c


def _good(rank: int, spec: dict) -> list[dict]:
    return [S.meta(rank, 2, coords={"pp": rank, "dp": 0, "tp": 0}, spec=spec),
            S.span(rank, 0, "step", 0, 100, cat="step"), S.span(rank, 0, "forward", 0, 40, mb=0),
            S.comm(rank, 0, "all_reduce", 50, 90, n=2, payload=1000),
            S.mem(rank, 0, 95, params=10), S.end(rank, 100)]


def _upload(client, run_id: str, name: str, text: str) -> None:
    r = client.put(f"/api/internal/runs/{run_id}/files/{name}", content=text.encode(),
                   headers=WORKER)
    assert r.status_code == 200, r.text


def _pages(client, run_id: str) -> dict[str, int]:
    return {p: client.get(f"/api/runs/{run_id}/{p}").status_code for p in PAGES}


# what workers were seen to send (the fuzzer's finds, and a random trace fuzzer's): each broke
# /metrics or the Gantt with a 500 before
SUMMARIES = ["5", '"text"', "[]", "null"]
METAS = [{"spec": 5}, {"spec": {"parallel": 5}}, {"coords": {"pp": "x"}}, {"world_size": "x"},
         # a spec of the right shape with a value of the wrong type: kept (the analysis says
         # it does not parse; the Gantt reads its integer degrees only)
         {"spec": {"parallel": {"dp": "two", "pp": 2}}}]
RECORDS = [("comm", {"payload_bytes": [1]}), ("comm", {"group_size": "x"}),
           ("span", {"name": {"a": 1}}), ("span", {"step": "x"}), ("mem", {"microbatch": []})]


@pytest.mark.parametrize("summary", SUMMARIES)
def test_a_summary_that_is_not_an_object_breaks_no_page(client, settings, summary):
    rid = client.post("/api/runs", json={"preset": "pp-1f1b"}).json()["id"]
    spec = client.get(f"/api/runs/{rid}").json()["spec"]
    for rank in (0, 1):
        _upload(client, rid, f"trace-rank{rank}.jsonl",
                "".join(json.dumps(r) + "\n" for r in _good(rank, spec)))
    _upload(client, rid, "summary.json", summary)
    codes = _pages(client, rid)
    assert all(c == 200 for c in codes.values()), codes
    warnings = client.get(f"/api/runs/{rid}/metrics").json()["warnings"]
    assert "summary.json is not a JSON object: ignored" in warnings


@pytest.mark.parametrize("fields", METAS, ids=lambda f: json.dumps(f))
def test_a_meta_field_of_the_wrong_shape_is_dropped_with_a_warning(client, settings, fields):
    rid = client.post("/api/runs", json={"preset": "pp-1f1b"}).json()["id"]
    spec = client.get(f"/api/runs/{rid}").json()["spec"]
    for rank in (0, 1):
        recs = _good(rank, spec)
        if rank == 0:
            recs[0] = {**recs[0], **fields}
        _upload(client, rid, f"trace-rank{rank}.jsonl",
                "".join(json.dumps(r) + "\n" for r in recs))
    codes = _pages(client, rid)
    assert all(c == 200 for c in codes.values()), codes
    tr = load_run_dir(settings.runs_dir / rid)
    name = next(iter(fields))
    dropped = any(w.startswith("rank 0: meta field(s)") and name in w for w in tr.warnings)
    assert dropped == (fields != METAS[-1]), tr.warnings
    assert tr.meta[1]["coords"] == {"pp": 1, "dp": 0, "tp": 0}  # the other rank's untouched


@pytest.mark.parametrize("kind,fields", RECORDS, ids=lambda x: json.dumps(x))
def test_a_record_with_a_field_of_the_wrong_type_is_a_skipped_line(client, settings, kind,
                                                                    fields):
    rid = client.post("/api/runs", json={"preset": "pp-1f1b"}).json()["id"]
    spec = client.get(f"/api/runs/{rid}").json()["spec"]
    for rank in (0, 1):
        recs = _good(rank, spec)
        if rank == 0:
            i = next(i for i, r in enumerate(recs) if r["type"] == kind)
            recs[i] = {**recs[i], **fields}
        _upload(client, rid, f"trace-rank{rank}.jsonl",
                "".join(json.dumps(r) + "\n" for r in recs))
    codes = _pages(client, rid)
    assert all(c == 200 for c in codes.values()), codes
    tr = load_run_dir(settings.runs_dir / rid)
    assert "rank 0: 1 unreadable or untimed line(s) skipped" in tr.warnings
    assert len(tr.ranks[0]) == len(tr.ranks[1]) - 1


def test_the_typed_fields_rule_keeps_every_record_a_real_run_writes():
    # the rule must not cost a real trace a line: every record shape synth writes (the
    # trace schema's) passes, optional fields as null included
    good = _good(0, {"preset": "ddp"})[1:] + [
        S.comm(0, 1, "send", 0, 5, n=2, payload=8, axis="pp", peer=1),
        {**S.span(0, -1, "setup", 0, 1), "microbatch": None}]
    from jobs.analysis.storage.jsonl import KEEP, admit
    assert [admit(dict(r)) for r in good] == [KEEP] * len(good)


# --- a failed run's error, and the files of a failed atomic write ----------------------------

def _supervisor(tmp_path):
    from worker.tasks import JobSupervisor
    sup = JobSupervisor.__new__(JobSupervisor)  # no job, no backend: the two steps only
    sup.run_id, sup.dir = "r1", tmp_path
    sup.out = tmp_path / "out"
    sup.out.mkdir()
    sent: list[str] = []
    sup.client = SimpleNamespace(upload=lambda run_id, rel, path: sent.append(rel))
    sup.logs = SimpleNamespace(add=lambda line: None)
    sup.shipped = {}  # nothing shipped live (the constructor's default): every file uploaded
    return sup, sent


def test_empty_error_files_leave_the_exit_code_not_blank_lines(tmp_path):
    sup, _ = _supervisor(tmp_path)
    for r in (0, 1):  # a full disk: the ranks could not write their tracebacks
        (sup.out / f"error-rank{r}.txt").write_text("" if r == 0 else "\n \n")
    assert sup._error_text(1) == "torchrun exited with code 1; see the run's log"
    (sup.out / "error-rank1.txt").write_text("RuntimeError: boom\n  at x\n")
    assert sup._error_text(1) == "RuntimeError: boom\n\nRuntimeError: boom\n  at x"


def test_half_written_files_are_not_uploaded_as_run_files(tmp_path):
    sup, sent = _supervisor(tmp_path)
    (tmp_path / "spec.json").write_text("{}")
    for name in ("trace-rank0.jsonl", "analysis.json.part", "trace.perfetto.json.part",
                 "flight-rank0.json.140.tmp", "checkpoints/step-000002/COMMITTED.tmp",
                 "checkpoints/step-000002/__0_0.distcp"):
        (sup.out / name).parent.mkdir(parents=True, exist_ok=True)
        (sup.out / name).write_text("x")
    sup._upload()
    assert sorted(sent) == ["checkpoints/step-000002/__0_0.distcp", "spec.json",
                            "trace-rank0.jsonl"]


# --- an unmigrated database, and the schema's text rule ----------------------------------------

def test_an_unmigrated_database_is_503_with_the_command_not_500(tmp_path):
    url = f"sqlite:///{tmp_path / 'never-migrated.db'}"
    s = Settings(data_dir=tmp_path / "var", database_url=url, worker_token="t" * 32)
    with TestClient(create_app(s), raise_server_exceptions=False) as c:
        h = c.get("/api/health")
        assert h.status_code == 503, h.text
        assert h.json()["status"] == "down"
        assert "paralab migrate" in h.json()["checks"]["database"]["error"]
        r = c.get("/api/runs")
        assert r.status_code == 503 and "not migrated" in r.json()["detail"], r.text
        assert c.get("/api/health/live").status_code == 200
    upgrade(url)  # and once migrated, the same process serves
    with TestClient(create_app(s), raise_server_exceptions=False) as c:
        assert c.get("/api/runs").status_code == 200
        assert c.get("/api/health").json()["checks"]["database"]["ok"] is True


def test_every_string_path_and_query_parameter_states_the_text_rule(client):
    from backend.api.schemas import TEXT_PATTERN
    schema = client.get("/openapi.json").json()
    owner = schema["paths"]["/api/comparisons"]["get"]["parameters"][0]
    assert owner["name"] == "owner" and owner["schema"]["anyOf"][0]["pattern"] == TEXT_PATTERN
    missing = []
    for path, ops in schema["paths"].items():
        for method, op in ops.items():
            for p in op.get("parameters", []):
                if p["in"] not in ("path", "query"):
                    continue
                for alt in p["schema"].get("anyOf", [p["schema"]]):
                    # the text rule, or a stricter pattern of the parameter's own (`sort`)
                    if alt.get("type") == "string" and "enum" not in alt and \
                            "pattern" not in alt:
                        missing.append(f"{method.upper()} {path} {p['name']}")
    assert not missing, missing
    # the two the fuzzer named, and what the rule refuses there
    assert "GET /api/comparisons owner" not in missing
    r = client.get("/api/sweeps", params={"tag": "a\x00"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "tag"]


def test_every_bound_the_routes_check_is_stated_in_json_schema_words(client):
    # pydantic writes a bound it cannot place as `ge` / `le`, which JSON Schema does not know:
    # the schema then said nothing of exit_code's int32 range (the fuzzer's ST202)
    schema = client.get("/openapi.json").json()
    unknown = []

    def walk(node, where):
        if isinstance(node, dict):
            unknown.extend(f"{where}.{k}" for k in ("ge", "le", "gt", "lt") if k in node)
            for k, v in node.items():
                walk(v, f"{where}.{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{where}[{i}]")
    walk(schema, "")
    assert not unknown, unknown
    for name in ("FinishIn", "NodeFinishIn"):
        code = schema["components"]["schemas"][name]["properties"]["exit_code"]["anyOf"][0]
        assert (code["minimum"], code["maximum"]) == (-(2**31), 2**31 - 1), code


FILE_PATHS = {  # hand-labelled: may a run file have this path?
    "trace-rank0.jsonl": True, "checkpoints/step-000002/__0_0.distcp": True, ".metadata": True,
    "..x": True, "...": True, ".": False, "..": False, "a/../b": False, "a/./b": False,
    "a//b": False, "/a": False, "a/": False, "a%2e": False, "a\n": False, "a b": False,
    "x" * 200: True, "x" * 201: False}


def test_the_schema_states_the_file_path_rule_the_route_enforces(client, tmp_path):
    # the fuzzer's "schema-valid request rejected" on the file routes: the rule was the
    # route's alone; now the schema's pattern and resolve_run_path agree, case by case
    import re

    from backend.errors import UnsafePath
    from backend.storage import FILE_PATH_PATTERN, resolve_run_path
    schema = client.get("/openapi.json").json()
    for path in ("/api/runs/{run_id}/files/{path}", "/api/internal/runs/{run_id}/files/{path}"):
        for op in schema["paths"][path].values():
            [p] = [p for p in op["parameters"] if p["name"] == "path"]
            assert p["schema"]["pattern"] == FILE_PATH_PATTERN
    ecma = re.compile(FILE_PATH_PATTERN.replace("$", r"\Z"))  # JSON Schema's $ ends the text
    for rel, ok in FILE_PATHS.items():
        assert bool(ecma.match(rel)) == ok, rel
        try:
            resolve_run_path(tmp_path, "r", rel)
            served = True
        except UnsafePath:
            served = False
        assert served == ok, rel
