"""Sweeps through the HTTP API in-process, against SQLite and PostgreSQL, backend only (no
worker: members stay queued): grid and explicit expansion, invalid members kept with their
reasons, limits and 422 shapes, cancel, list filters, permissions; and a backend restart."""

from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient

from backend.crud.sweeps import sweep_status
from backend.main import create_app
from tests.auth.conftest import Users

MLP = {"preset": "ddp", "model": {"arch": "mlp"}, "train": {"steps": 2}}



def _runs(client) -> list[dict]:
    return client.get("/api/runs", params={"limit": 500}).json()["items"]


def test_grid_expands_in_key_order_and_queues_every_member(client, settings):
    r = client.post("/api/sweeps", json={"name": "z x b", "base": MLP, "tags": ["sw"],
                                         "grid": {"parallel.zero_stage": [0, 2, 3],
                                                  "parallel.bucket_mb": [1, 25]}})
    assert r.status_code == 201, r.text
    s = r.json()
    assert s["status"] == "queued" and s["counts"] == {"queued": 6, "total": 6}
    got = [(m["overrides"]["parallel"]["zero_stage"], m["overrides"]["parallel"]["bucket_mb"])
           for m in s["members"]]
    assert got == [(0, 1), (0, 25), (2, 1), (2, 25), (3, 1), (3, 25)]
    assert [m["index"] for m in s["members"]] == list(range(6))
    runs = {x["id"]: x for x in _runs(client)}
    assert set(runs) == {m["run_id"] for m in s["members"]}
    for m in s["members"]:
        run = client.get(f"/api/runs/{m['run_id']}").json()
        assert run["spec"]["parallel"]["zero_stage"] == m["overrides"]["parallel"]["zero_stage"]
        assert run["spec"]["parallel"]["bucket_mb"] == m["overrides"]["parallel"]["bucket_mb"]
        assert run["tags"] == ["sw"] and run["status"] == "queued"
        assert m["predicted"]["peak_memory_bytes"] > 0 and m["errors"] is None
    assert len({x["name"] for x in runs.values()}) == 6  # the history tells them apart
    assert len(list((settings.broker_dir / "queue").iterdir())) == 6
    # ZeRO-3 predicts less memory per rank than DDP (the theory, per member)
    pred = [m["predicted"]["peak_memory_bytes"] for m in s["members"]]
    assert pred[4] < pred[0]
    assert client.get(f"/api/sweeps/{s['id']}").json()["members"] == s["members"]


def test_root_axis_changes_several_fields_together(client):
    world = [{"parallel": {"dp": n}, "runtime": {"nproc_per_node": n}} for n in (2, 4)]
    r = client.post("/api/sweeps", json={"base": MLP, "grid": {
        ".": world, "parallel.zero_stage": [0, 3]}})
    assert r.status_code == 201, r.text
    ws = [client.get(f"/api/runs/{m['run_id']}").json()["world_size"]
          for m in r.json()["members"]]
    assert ws == [2, 2, 4, 4]


def test_explicit_members_invalid_ones_kept_with_their_422_reasons(client):
    r = client.post("/api/sweeps", json={"name": "mixed", "base": MLP, "members": [
        {}, {"parallel": {"dp": 3}}, {"train": {"steps": -1}}, {"parallel": {"zero_stage": 3}}]})
    assert r.status_code == 201, r.text
    s = r.json()
    st = [m["status"] for m in s["members"]]
    assert st == ["queued", "invalid", "invalid", "queued"]
    assert s["counts"] == {"invalid": 2, "queued": 2, "total": 4}
    bad = s["members"][2]
    assert bad["run_id"] is None and bad["predicted"] is None
    # the same detail POST /api/runs answers for that spec
    direct = client.post("/api/runs", json={**MLP, "train": {"steps": -1}}).json()["detail"]
    assert bad["errors"] == direct and bad["errors"][0]["loc"] == ["body", "train", "steps"]
    assert s["members"][1]["errors"][0]["loc"][0] == "body"
    assert len(_runs(client)) == 2


@pytest.mark.parametrize("body,loc,fragment", [
    ({"base": MLP}, ["body", "members"], "exactly one"),
    ({"base": MLP, "grid": {"parallel.dp": [2]}, "members": [{}]}, ["body", "grid"], "both"),
    ({"base": MLP, "grid": {"parallel.zero_stage": [0, 1, 2, 3] * 4,
                            "parallel.bucket_mb": list(range(1, 18))}}, ["body", "grid"],
     "expands to 272 members; at most 256"),
    ({"base": MLP, "members": [{}] * 257}, ["body", "members"], "at most 256"),
    ({"base": MLP, "grid": {"parallel..dp": [2]}}, ["body", "grid", "parallel..dp"], "dotted"),
    ({"base": MLP, "grid": {"parallel.dp": []}}, ["body", "grid", "parallel.dp"], "non-empty"),
    ({"base": MLP, "grid": {".": [1]}}, ["body", "grid", "."], "object"),
    ({"base": MLP, "members": [{}], "extra": 1}, ["body", "extra"], "unknown field"),
    ({"members": [{}]}, ["body", "base"], "required"),
    ({"base": MLP, "members": [{}], "name": "a\x00b"}, ["body", "name"], ""),
    ({"base": MLP, "members": [{}], "tags": "x"}, ["body", "tags"], "tags"),
    ({"base": MLP, "members": [{"train": {"steps": 0}}, {"parallel": {"dp": 3}}]},
     ["body", "members", 0, "train", "steps"], ""),
    ({"base": MLP, "members": [{}], "cluster": 3}, ["body", "cluster"], "object"),
    ({"base": MLP, "members": [{}], "cluster": {"intra_GBps": 1}},
     ["body", "cluster", "inter_GBps"], "required"),
    ({"base": MLP, "members": [{}], "cluster": {"intra_GBps": 1, "inter_GBps": -1}},
     ["body", "cluster", "inter_GBps"], "positive"),
    ({"base": MLP, "members": [{}], "cluster": {"intra_GBps": 1, "inter_GBps": 1, "x": 1}},
     ["body", "cluster", "x"], "unknown field"),
])
def test_bad_bodies_are_422_naming_the_field_and_nothing_is_stored(client, body, loc,
                                                                    fragment):
    r = client.post("/api/sweeps", json=body)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert any(e["loc"] == loc and fragment in e["msg"] for e in detail), detail
    assert client.get("/api/sweeps").json()["items"] == [] and _runs(client) == []


def test_cluster_gives_each_member_the_advisors_breakdown(client):
    """With the advisor's cluster every member's prediction is jobs.theory.advisor's (compute,
    bubble, comm, step at those bandwidths); without it, predict()'s alone and no
    calibration."""
    timed = {"name": "t", "model": {"arch": "timed", "layers": 4, "hidden": 8},
             "parallel": {"dp": 2}, "runtime": {"nproc_per_node": 2}}
    cluster = {"intra_GBps": 2.0, "inter_GBps": 1.0}
    s = client.post("/api/sweeps", json={"base": timed, "cluster": cluster, "members": [
        {}, {"parallel": {"dp": 1, "pp": 2, "microbatches": 2}}]}).json()
    # by hand: the timed layer's default forward, backward-input and backward-weight are
    # 10 ms each, so a stage's micro-batch costs layers/pp x 30 ms. Member 0 (dp 2): 4 x 30
    # ms, DDP's ring all-reduce of 4 x (8 x 8 + 8) fp32 parameters moves 2 (n-1)/n x 1152
    # = 1152 B at 2 GB/s (one host). Member 1 (pp 2, 2 micro-batches, 1F1B): 2 x 2 x 30 ms
    # busy, (pp - 1) x 2 x 30 ms idle; each stage sends 2 micro-batches of 4 samples x 8
    # fp32 (the activations forward, their gradients back): 256 B at 2 GB/s.
    hand = [{"compute_s": 0.12, "bubble_s": 0.0, "comm_s": 1152 / 2e9},
            {"compute_s": 0.12, "bubble_s": 0.06, "comm_s": 256 / 2e9}]
    for m, want in zip(s["members"], hand, strict=True):
        want["step_time_s"] = sum(want.values())
        assert {k: m["predicted"][k] for k in want} == pytest.approx(want, rel=1e-9)
        assert m["predicted"]["inter_GBps"] == 1.0
    assert s["calibration"]["n"] == 0 and len(s["calibration"]["rows"]) == 2
    plain = client.post("/api/sweeps", json={"base": timed, "members": [{}]}).json()
    assert plain["calibration"] is None and "compute_s" not in plain["members"][0]["predicted"]


def test_cancel_cancels_every_queued_member_then_409(client):
    s = client.post("/api/sweeps", json={"base": MLP, "members": [{}, {}, {"x": 1}]}).json()
    r = client.post(f"/api/sweeps/{s['id']}/cancel")
    assert r.status_code == 200, r.text
    c = r.json()
    assert c["status"] == "cancelled" and c["counts"] == {"cancelled": 2, "invalid": 1,
                                                          "total": 3}
    assert all(client.get(f"/api/runs/{m['run_id']}").json()["status"] == "cancelled"
               for m in c["members"] if m["run_id"])
    assert client.post(f"/api/sweeps/{s['id']}/cancel").status_code == 409
    assert client.post("/api/sweeps/nope/cancel").status_code == 404
    assert client.get("/api/sweeps/nope").status_code == 404


def test_list_filters_and_pages(client):
    a = client.post("/api/sweeps", json={"name": "alpha", "base": MLP, "members": [{}],
                                         "tags": ["t1"]}).json()
    b = client.post("/api/sweeps", json={"name": "beta", "base": MLP, "members": [{}]}).json()
    client.post(f"/api/sweeps/{b['id']}/cancel")
    ids = lambda **p: [x["id"] for x in client.get("/api/sweeps", params=p).json()["items"]]  # noqa: E731
    assert ids() == [b["id"], a["id"]]
    assert ids(q="alp") == [a["id"]] and ids(tag="t1") == [a["id"]]
    assert ids(status="cancelled") == [b["id"]] and ids(status="queued,running") == [a["id"]]
    assert ids(owner="local") == [b["id"], a["id"]] and ids(owner="nobody") == []
    page = client.get("/api/sweeps", params={"limit": 1}).json()
    assert [x["id"] for x in page["items"]] == [b["id"]] and page["items"][0]["members"] is None
    nxt = client.get("/api/sweeps", params={"limit": 1, "offset": page["next_offset"]}).json()
    assert [x["id"] for x in nxt["items"]] == [a["id"]] and nxt["next_offset"] is None


def test_status_rule():
    def sw(*statuses):
        return SimpleNamespace(members=[SimpleNamespace(errors=None, run=SimpleNamespace(
            status=s)) for s in statuses] + [SimpleNamespace(errors=[{}], run=None)])
    assert sweep_status(sw("queued", "queued")) == "queued"
    assert sweep_status(sw("queued", "succeeded")) == "running"
    assert sweep_status(sw("running", "queued")) == "running"
    assert sweep_status(sw("succeeded", "succeeded")) == "succeeded"
    assert sweep_status(sw("cancelled", "cancelled")) == "cancelled"
    assert sweep_status(sw("failed", "cancelled")) == "failed"
    assert sweep_status(sw("succeeded", "hung")) == "partial"
    assert sweep_status(sw()) == "failed"


@pytest.fixture
def team_client(tmp_path, db_url):
    from backend.core.config import Settings
    from tests.auth.conftest import FAST_ARGON2, SECRET
    st = Settings(data_dir=tmp_path / "var", database_url=db_url, worker_token="w" * 40,
                  auth="required", secret_key=SECRET, **FAST_ARGON2)
    with TestClient(create_app(st)) as c:
        yield c, Users(st)


def test_team_mode_shared_like_runs(team_client):
    team, users = team_client
    alice, bob = users.create("alice"), users.create("bob")
    viewer, admin = users.create("vic", role="viewer"), users.create("ann", role="admin")
    limited = users.create("lim", max_concurrent_runs=2, max_world_size=2)
    body = {"name": "<script>x</script>", "base": MLP, "members": [{}, {}]}
    assert team.post("/api/sweeps", json=body, headers=viewer).status_code == 403
    s = team.post("/api/sweeps", json=body, headers=alice).json()
    seen = team.get(f"/api/sweeps/{s['id']}", headers=viewer).json()
    assert seen["name"] == "<script>x</script>" and seen["can_modify"] is False
    assert [x["id"] for x in team.get("/api/sweeps", headers=bob).json()["items"]] == [s["id"]]
    r = team.post(f"/api/sweeps/{s['id']}/cancel", headers=bob)
    assert r.status_code == 403 and "owner (alice)" in r.json()["detail"]
    assert team.post(f"/api/sweeps/{s['id']}/cancel", headers=viewer).status_code == 403
    assert team.post(f"/api/sweeps/{s['id']}/cancel", headers=admin).status_code == 200
    # per-user limits: the sweep counts as all its runs; too wide a member is an invalid member
    r = team.post("/api/sweeps", json={**body, "members": [{}, {}, {}]}, headers=limited)
    assert r.status_code == 403 and "adds 3" in r.json()["detail"]
    wide = {"parallel": {"dp": 4}, "runtime": {"nproc_per_node": 4}}
    r = team.post("/api/sweeps", json={**body, "members": [{}, wide]}, headers=limited)
    assert r.status_code == 201, r.text
    assert r.json()["members"][1]["errors"][0]["type"] == "user_limit"
    assert len(team.get("/api/sweeps", headers=admin).json()["items"]) == 2


@pytest.fixture
def backend_only(tmp_path):
    from tests.conftest import backend_only_service
    yield from backend_only_service(tmp_path)


def test_a_backend_restart_loses_nothing(backend_only):
    svc = backend_only
    r = svc.http.post("/api/sweeps", json={"base": MLP, "grid": {"parallel.zero_stage": [0, 3]}})
    assert r.status_code == 201, r.text
    before = r.json()
    svc.stop(svc.backend)
    svc.start_backend()
    after = svc.http.get(f"/api/sweeps/{before['id']}").json()
    assert after["members"] == before["members"] and after["status"] == "queued"
