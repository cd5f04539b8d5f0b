"""A sweep member whose run was deleted from the history (issue 43, miss 5), through the HTTP
API on SQLite and PostgreSQL, backend only (no worker: runs stay queued until cancelled):
the member stays, says `deleted` (not `invalid`: it launched, and has no 422 errors), and is
left out of the sweep's status (docs/sweeps.md), by hand:

    members: A (valid), B (valid), C (train.steps = -1: invalid)
    A cancelled, then deleted   -> A deleted, B queued, C invalid; the sweep `queued` (B)
    B cancelled                 -> the sweep `cancelled` (every launched run left cancelled)
    B deleted                   -> the sweep `failed` (no launched run left)"""

from __future__ import annotations

MLP = {"preset": "ddp", "model": {"arch": "mlp"}, "train": {"steps": 2}}


def _sweep(client, sid: str) -> dict:
    r = client.get(f"/api/sweeps/{sid}")
    assert r.status_code == 200, r.text
    return r.json()


def _cancel(client, run_id: str) -> None:
    r = client.post(f"/api/runs/{run_id}/cancel")
    assert r.status_code == 200 and r.json()["status"] == "cancelled", r.text


def _delete(client, run_id: str) -> None:
    r = client.delete(f"/api/runs/{run_id}")
    assert r.status_code == 204, r.text
    assert client.get(f"/api/runs/{run_id}").status_code == 404


def test_a_deleted_members_run_reads_deleted_not_invalid(client):
    r = client.post("/api/sweeps", json={"name": "del", "base": MLP, "members": [
        {}, {"parallel": {"zero_stage": 2}}, {"train": {"steps": -1}}]})
    assert r.status_code == 201, r.text
    s = r.json()
    a, b, c = (m["run_id"] for m in s["members"])
    assert a and b and c is None
    assert [m["status"] for m in s["members"]] == ["queued", "queued", "invalid"]

    _cancel(client, a)
    _delete(client, a)
    s = _sweep(client, s["id"])
    assert [m["status"] for m in s["members"]] == ["deleted", "queued", "invalid"]
    gone = s["members"][0]
    assert gone["run_id"] is None and gone["errors"] is None and gone["run"] is None
    assert gone["overrides"] == {}
    assert s["counts"] == {"deleted": 1, "invalid": 1, "queued": 1, "total": 3}
    assert s["status"] == "queued"

    _cancel(client, b)
    s = _sweep(client, s["id"])
    assert s["status"] == "cancelled"
    assert s["counts"] == {"cancelled": 1, "deleted": 1, "invalid": 1, "total": 3}

    _delete(client, b)
    s = _sweep(client, s["id"])
    assert [m["status"] for m in s["members"]] == ["deleted", "deleted", "invalid"]
    assert s["counts"] == {"deleted": 2, "invalid": 1, "total": 3}
    assert s["status"] == "failed"
    listed = client.get("/api/sweeps", params={"status": "failed"}).json()
    items = listed["items"] if isinstance(listed, dict) else listed
    assert [x["id"] for x in items] == [s["id"]]
