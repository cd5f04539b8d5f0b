"""max_concurrent_runs = N allows N queued-or-running runs, and refuses the (N+1)-th naming the
limit (docs/security.md "Quotas"); a sweep that brings the count to exactly N is accepted.
Counted by hand; in-process on SQLite and PostgreSQL."""

from __future__ import annotations

MLP = {"preset": "ddp", "model": {"arch": "mlp"}, "train": {"steps": 2}}  # world size 2


def test_the_limit_admits_exactly_n_runs(team, users):
    bob, root = users.create("bob"), users.create("root", role="admin")
    r = team.patch("/api/users/bob", json={"max_concurrent_runs": 3}, headers=root)
    assert r.status_code == 200, r.text[:300]
    assert team.post("/api/runs", json=MLP, headers=bob).status_code == 201  # 1 of 3
    two = team.post("/api/sweeps", json={"name": "two", "base": MLP, "members": [{}, {}]},
                    headers=bob)
    assert two.status_code == 201, two.text[:300]  # 1 + 2 = 3: exactly the limit
    assert team.get("/api/users/bob/limits", headers=bob).json()["active_runs"] == 3
    r = team.post("/api/runs", json=MLP, headers=bob)  # the 4th
    assert r.status_code == 403, r.text[:300]
    assert "max_concurrent_runs=3" in r.json()["detail"]
    assert "already have 3" in r.json()["detail"]
