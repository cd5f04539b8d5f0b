"""The HTTP API in-process, against SQLite and PostgreSQL: validation (422, nothing stored),
history queries (filters, sort, cursor pagination), cancel of a queued run, logs, files."""

import pytest
from fastapi.testclient import TestClient

from backend import crud
from backend.core.db import get_sessionmaker
from backend.main import create_app
from tests.service.test_spec import RULES


def count_runs(client) -> int:
    return len(client.get("/api/runs", params={"limit": 500}).json()["items"])


@pytest.mark.parametrize("data,loc,fragment", [r[1:] for r in RULES], ids=[r[0] for r in RULES])
def test_every_rule_is_a_422_naming_the_field_and_nothing_is_stored(client, data, loc,
                                                                    fragment):
    data = {"parallel": {"dp": 2}, **data} if "parallel" not in data else data
    r = client.post("/api/runs", json=data)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert any(e["loc"] == ["body", *loc] and fragment in e["msg"] for e in detail), detail
    assert count_runs(client) == 0


@pytest.mark.parametrize("body,loc", [
    ({"preset": "ddp", "tags": "not-a-list"}, ["body", "tags"]),
    ({"preset": "ddp", "tags": ["x" * 65]}, ["body", "tags"]),
    ({"preset": "ddp", "notes": 5}, ["body", "notes"]),
    ({"preset": "nope"}, ["body", "preset"]),
])
def test_run_metadata_and_preset_errors(client, body, loc):
    r = client.post("/api/runs", json=body)
    assert r.status_code == 422
    assert any(e["loc"] == loc for e in r.json()["detail"]), r.json()
    assert count_runs(client) == 0


def test_non_object_body_is_422(client):
    r = client.post("/api/runs", json=[1, 2])
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][0] == "body"


def test_submit_stores_queues_and_cancels(client, settings):
    r = client.post("/api/runs", json={"preset": "ddp", "name": "<img src=x onerror=alert(1)>",
                                       "tags": ["a", "b"], "notes": "hello"})
    assert r.status_code == 201, r.text
    run = r.json()
    assert run["status"] == "queued" and run["strategy"] == "ddp" and run["world_size"] == 2
    assert run["name"] == "<img src=x onerror=alert(1)>" and run["tags"] == ["a", "b"]
    assert run["spec"]["parallel"]["dp"] == 2 and run["spec"]["version"] == 1
    # The message on the (embedded) broker carries only the run's ID.
    queued = list((settings.broker_dir / "queue").iterdir())
    assert len(queued) == 1 and run["id"].encode() in queued[0].read_bytes()
    assert b"onerror" not in queued[0].read_bytes()
    r = client.post(f"/api/runs/{run['id']}/cancel")
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    assert client.post(f"/api/runs/{run['id']}/cancel").status_code == 409
    assert client.get("/api/runs/nope").status_code == 404


def test_list_filters_sort_and_cursor_pagination(client, settings):
    ids = []
    for i in range(23):
        body = {"preset": "ddp" if i % 2 else "dp-allreduce", "name": f"run {i:02d}",
                "tags": ["even"] if i % 2 == 0 else []}
        ids.append(client.post("/api/runs", json=body).json()["id"])
    with get_sessionmaker(settings.db_url)() as db:  # a finished one, for the status filter
        crud.claim(db, ids[0], worker="w", task_id=None)
        crud.finish(db, ids[0], status="succeeded", exit_code=0, error=None, summary={},
                    provenance={})
    seen, cursor = [], None
    while True:
        params = {"limit": 5, **({"cursor": cursor} if cursor else {})}
        page = client.get("/api/runs", params=params).json()
        seen += [r["id"] for r in page["items"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert seen == ids[::-1]  # newest first, every run exactly once
    by_name = client.get("/api/runs", params={"sort": "name", "limit": 3}).json()["items"]
    assert [r["name"] for r in by_name] == ["run 00", "run 01", "run 02"]
    names, cursor = [], None
    while True:
        params = {"sort": "-name", "limit": 4, **({"cursor": cursor} if cursor else {})}
        page = client.get("/api/runs", params=params).json()
        names += [r["name"] for r in page["items"]]
        if not (cursor := page["next_cursor"]):
            break
    assert names == sorted(names, reverse=True) and len(names) == 23
    assert len(client.get("/api/runs", params={"strategy": "ddp"}).json()["items"]) == 11
    assert len(client.get("/api/runs", params={"tag": "even"}).json()["items"]) == 12
    assert [r["id"] for r in client.get("/api/runs", params={"status": "succeeded"}).json()[
        "items"]] == [ids[0]]
    assert [r["name"] for r in client.get("/api/runs", params={"q": "RUN 07"}).json()[
        "items"]] == ["run 07"]
    assert len(client.get("/api/runs", params={"owner": "local", "limit": 500}).json()[
        "items"]) == 23
    bad = client.get("/api/runs", params={"cursor": "garbage"})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["query", "cursor"]
    bad = client.get("/api/runs", params={"sort": "bogus"})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["query", "sort"]


def test_presets_spec_health_and_docs(client):
    presets = client.get("/api/presets").json()
    assert {"ddp", "zero3", "fsdp", "pp-zb", "3d"} <= {p["name"] for p in presets}
    assert client.get("/api/spec").json()["fields"]["parallel.pp_schedule"]["choices"]
    health = client.get("/api/health")
    assert health.status_code == 200 and health.json()["checks"]["database"]["ok"]
    assert client.get("/docs").status_code == 200
    assert "/api/runs" in client.get("/openapi.json").json()["paths"]


def test_worker_channel_needs_the_worker_credential(client):
    run = client.post("/api/runs", json={"preset": "ddp"}).json()
    assert client.post(f"/api/internal/runs/{run['id']}/claim",
                       json={"worker": "w"}).status_code == 401
    assert client.post(f"/api/internal/runs/{run['id']}/claim", json={"worker": "w"},
                       headers={"Authorization": "Bearer wrong"}).status_code == 401


def test_worker_channel_logs_stream_and_files(client, settings):
    auth = {"Authorization": f"Bearer {settings.worker_token}"}
    run = client.post("/api/runs", json={"preset": "ddp"}).json()
    rid = run["id"]
    first = client.post(f"/api/internal/runs/{rid}/claim", json={"worker": "w1"}, headers=auth)
    assert first.json()["launch"] is True and first.json()["spec"]["kind"] == "train"
    again = client.post(f"/api/internal/runs/{rid}/claim", json={"worker": "w2"}, headers=auth)
    assert again.json()["launch"] is False  # a redelivered message never launches twice
    lines = [{"seq": i, "line": f"[default{i % 2}]:line {i}"} for i in range(6)]
    assert client.post(f"/api/internal/runs/{rid}/logs", json={"lines": lines},
                       headers=auth).json()["added"] == 6
    assert client.post(f"/api/internal/runs/{rid}/logs", json={"lines": lines[:3]},
                       headers=auth).json()["added"] == 0  # retried batch: idempotent
    assert client.get(f"/api/runs/{rid}/logs").text.count("\n") == 6
    assert client.get(f"/api/runs/{rid}/logs", params={"rank": 1}).text == \
        "[default1]:line 1\n[default1]:line 3\n[default1]:line 5\n"
    beat = client.post(f"/api/internal/runs/{rid}/heartbeat", headers=auth).json()
    assert beat == {"status": "running", "cancel": False}
    client.post(f"/api/runs/{rid}/cancel")
    assert client.post(f"/api/internal/runs/{rid}/heartbeat", headers=auth).json()["cancel"]
    up = client.put(f"/api/internal/runs/{rid}/files/trace-rank0.jsonl", content=b'{"a":1}\n',
                    headers=auth)
    assert up.status_code == 200 and up.json()["size"] == 8
    for evil in ("../x", "..%2Fx", "%2e%2e/x", "/etc/passwd", "a/../../x"):
        r = client.put(f"/api/internal/runs/{rid}/files/{evil}", content=b"x", headers=auth)
        assert r.status_code >= 400, (evil, r.status_code)
    assert not [p for p in settings.data_dir.rglob("x")]  # nothing written anywhere
    done = client.post(f"/api/internal/runs/{rid}/finish", headers=auth,
                       json={"status": "cancelled", "exit_code": -15, "error": "cancelled"})
    assert done.json()["status"] == "cancelled"
    # finished: a late retry of another outcome changes nothing
    client.post(f"/api/internal/runs/{rid}/finish", headers=auth, json={"status": "succeeded"})
    assert client.get(f"/api/runs/{rid}").json()["status"] == "cancelled"
    # the same outcome reported again with the summary (after the partial trace's analysis)
    client.post(f"/api/internal/runs/{rid}/finish", headers=auth, json={
        "status": "cancelled", "summary": {"loss": [1.0], "headline": {"step_time_s": 0.5}}})
    got = client.get(f"/api/runs/{rid}").json()
    assert got["status"] == "cancelled" and got["summary"]["loss"] == [1.0]
    assert got["metrics"] == {"step_time_s": 0.5} and got["error"] == "cancelled"
    files = client.get(f"/api/runs/{rid}/files").json()
    assert [f["path"] for f in files] == ["trace-rank0.jsonl"]
    assert client.get(f"/api/runs/{rid}/files/trace-rank0.jsonl").content == b'{"a":1}\n'
    for evil in ("..%2F..%2Fparalab.db", "%252e%252e/worker-token", "../../worker-token"):
        r = client.get(f"/api/runs/{rid}/files/{evil}")
        assert r.status_code >= 400 and settings.worker_token not in r.text, evil
    # SSE: resumes after Last-Event-ID and ends with the final status.
    with client.stream("GET", f"/api/runs/{rid}/logs/stream",
                       headers={"Last-Event-ID": "3"}) as r:
        body = "".join(r.iter_text())
    assert "id: 3\n" not in body and "id: 4\ndata: [default0]:line 4" in body
    assert "event: end\ndata: cancelled" in body


def test_reaper_fails_runs_whose_worker_went_silent(settings):
    from datetime import timedelta

    from backend.models import Run, utcnow
    with TestClient(create_app(settings)) as c:
        rid = c.post("/api/runs", json={"preset": "ddp"}).json()["id"]
    with get_sessionmaker(settings.db_url)() as db:
        crud.claim(db, rid, worker="gone@host", task_id=None)
        assert crud.reap_lost_runs(db, timeout_s=60) == []
        db.get(Run, rid).heartbeat_at = utcnow() - timedelta(seconds=61)
        db.commit()
        assert crud.reap_lost_runs(db, timeout_s=60) == [rid]
        run = db.get(Run, rid)
        db.refresh(run)
        assert run.status == "failed" and "worker lost" in run.error and "gone@host" in run.error


def test_memory_gate_refuses_with_numbers_and_can_be_overridden(client, settings):
    with get_sessionmaker(settings.db_url)() as db:
        crud.upsert_worker(db, name="gpu0@h", host="h", queue="gpu0", slots=1, busy=0,
                           devices=[{"type": "cuda", "index": 0, "name": "Tiny",
                                     "memory_bytes": 1_000_000}], info={})
    big = {"preset": "ddp", "model": {"hidden": 512, "layers": 8},
           "runtime": {"queue": "gpu0"}}
    r = client.post("/api/runs", json=big)
    assert r.status_code == 422, r.text
    msg = r.json()["detail"][0]["msg"]
    assert "predicted memory per rank" in msg and "0.001 GB" in msg and "force=true" in msg
    assert count_runs(client) == 0
    assert client.post("/api/runs", json={**big, "model": {"hidden": 8, "layers": 1}}
                       ).status_code == 201  # fits
    assert client.post("/api/runs", params={"force": "true"}, json=big).status_code == 201


def test_predict_endpoint_whatif_spec_and_errors(client):
    # seed 000: 7.5B on 64 GPUs, 16Ψ, ZeRO-1 -> 31.4 GB per rank
    r = client.post("/api/predict", json={"params": 7.5e9, "dp": 64, "tp": 1, "pp": 1,
                                          "zero_stage": 1, "memory_model": "16psi"})
    assert r.status_code == 200, r.text
    mem = r.json()["memory"]
    assert round(mem["per_rank_bytes"] / 1e9, 1) == 31.4 and mem["memory_model"] == "16psi"
    assert set(mem["components"]) >= {"params", "grads", "optimizer", "activations"}
    r = client.post("/api/predict", json={"spec": {"preset": "pp-1f1b"},
                                          "assumptions": {"bandwidth_GBps": 25}})
    assert r.status_code == 200 and abs(r.json()["pipeline"]["bubble_fraction"] - 0.2) < 1e-9
    assert client.post("/api/predict", json={"preset": "zero3"}).status_code == 200
    bad = client.post("/api/predict", json={"params": 1e9, "dp": 0, "tp": 1, "pp": 1,
                                            "zero_stage": 0, "memory_model": "16psi"})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "dp"]
    bad = client.post("/api/predict", json={"spec": {"preset": "ddp"},
                                            "assumptions": {"bogus": 1}})
    assert bad.status_code == 422
    assert bad.json()["detail"][0]["loc"] == ["body", "assumptions", "bogus"]
    bad = client.post("/api/predict", json={"spec": {"preset": "ddp",
                                                     "parallel": {"dp": 3}}})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"][:2] == ["body", "spec"]


def test_predict_endpoint_two_hosts_what_if_and_a_multi_host_submission(client):
    """A what-if may place ranks on several hosts (issue #16 part 4); so may a submitted run,
    which waits for its hosts saying why (no worker here)."""
    r = client.post("/api/predict", json={
        "params": 1e9, "dp": 2, "tp": 4, "pp": 1, "zero_stage": 0, "memory_model": "16psi",
        "layers": 4, "hidden": 1024, "heads": 16, "seq_len": 512, "micro_batch_size": 2,
        "nnodes": 2, "intra_bandwidth_GBps": 100, "inter_bandwidth_GBps": 10})
    assert r.status_code == 200, r.text
    links = r.json()["comm"]["links"]
    per_axis = {row["axis"]: row for row in links["per_axis"]}
    assert links["nnodes"] == 2 and links["nproc_per_node"] == 4
    assert per_axis["tp"]["link"] == "intra" and per_axis["dp"]["link"] == "inter"
    assert per_axis["dp"]["time_s"] == pytest.approx(per_axis["dp"]["bytes_per_rank"] / 10e9)
    r = client.post("/api/predict", json={"spec": {"preset": "ddp"},
                                          "assumptions": {"nnodes": 2}})
    assert r.status_code == 200, r.text
    assert r.json()["comm"]["links"]["per_axis"][1]["link"] == "inter"  # tp, dp, pp
    bad = client.post("/api/predict", json={"spec": {"preset": "ddp"},
                                            "assumptions": {"nnodes": 3}})
    assert bad.status_code == 422
    assert bad.json()["detail"][0]["loc"] == ["body", "assumptions", "nnodes"]
    r = client.post("/api/runs", json={"preset": "ddp", "parallel": {"dp": 4},
                                       "runtime": {"nnodes": 2}})
    assert r.status_code == 201, r.text
    run = client.get(f"/api/runs/{r.json()['id']}").json()
    assert run["status"] == "queued" and run["nnodes"] == 2 and run["nodes"] == []
    assert run["placement_wait"].startswith("needs 2 hosts at once; no live worker serves "
                                            "queue 'default'")
    assert count_runs(client) == 1
