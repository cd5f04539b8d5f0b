"""POST /api/sweep-checks (the sweep builder's check before launch, issue 37 item 11): the
same checks as POST /api/sweeps, nothing stored."""

from __future__ import annotations

BASE = {"preset": "ddp", "model": {"arch": "mlp"}}


def test_validate_counts_members_and_names_each_invalid_one_storing_nothing(client):
    body = {"name": "dry", "base": BASE, "grid": {"parallel.zero_stage": [0, 2],
                                                  "parallel.dp": [2, 3]}}
    r = client.post("/api/sweep-checks", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["members"] == 4 and out["valid"] == 2
    bad = [m for m in out["items"] if m["errors"]]
    assert [m["overrides"]["parallel"]["dp"] for m in bad] == [3, 3]
    assert all(m["predicted"] is None for m in bad)
    assert all(m["predicted"]["peak_memory_bytes"] > 0 for m in out["items"] if not m["errors"])
    assert client.get("/api/sweeps").json()["items"] == []
    assert client.get("/api/runs").json()["items"] == []
    # the submission itself agrees: the same members, the same invalid ones
    sw = client.post("/api/sweeps", json=body).json()
    assert [m["errors"] is None for m in sw["members"]] == [not m["errors"]
                                                            for m in out["items"]]


def test_validate_refuses_what_submit_refuses(client):
    r = client.post("/api/sweep-checks", json={"base": BASE, "grid": {"parallel.dp": []}})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][:2] == ["body", "grid"]
    r = client.post("/api/sweep-checks", json={"base": BASE, "grid": {"parallel.dp": [3]}})
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"][:3] == ["body", "members", 0]
    assert client.get("/api/sweeps").json()["items"] == []
