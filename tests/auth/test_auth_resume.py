"""Resuming someone else's run in team mode (issue 36, item 9; docs/security.md, Roles): a
member may resume any finished run from its complete checkpoint; the new run is the caller's
(owner, limits, who may cancel it), the parent is only read; a viewer resumes nothing."""

from __future__ import annotations

import json

from backend import crud
from backend.core.db import get_sessionmaker
from jobs.ckpt_index import FORMAT, MODEL_KEYS, step_dir


def _finished_with_checkpoint(team, settings, headers) -> dict:
    r = team.post("/api/runs", json={"preset": "ddp", "name": "alice's",
                                     "train": {"checkpoint_every": 2}}, headers=headers)
    assert r.status_code == 201, r.text
    run = r.json()
    with get_sessionmaker(settings.db_url)() as db:
        assert crud.claim(db, run["id"], worker="w", task_id=None)[0]
        crud.finish(db, run["id"], status="succeeded", exit_code=0, error=None, summary=None,
                    provenance=None)
        spec = crud.get_run(db, run["id"]).spec
    # a complete checkpoint as jobs/ckpt.py writes it: every listed file, then the marker
    d = step_dir(settings.runs_dir / run["id"], 2)
    d.mkdir(parents=True)
    files = {".metadata": b"m" * 10, "__0_0.distcp": b"x" * 100, "__1_0.distcp": b"y" * 101}
    for name, data in files.items():
        (d / name).write_bytes(data)
    (d / "COMMITTED").write_text(json.dumps({
        "format": FORMAT, "step": 2, "world_size": 2,
        "model": {k: spec["model"][k] for k in MODEL_KEYS},
        "optimizer": spec["train"]["optimizer"], "files": {n: len(b) for n, b in files.items()}}))
    return run


def test_a_member_resumes_anothers_run_as_their_own(team, team_settings, users):
    alice, bob = users.create("alice"), users.create("bob")
    viewer = users.create("vera", "viewer")
    parent = _finished_with_checkpoint(team, team_settings, alice)

    r = team.post(f"/api/runs/{parent['id']}/resume", json={"step": 2}, headers=bob)
    assert r.status_code == 201, r.text
    child = r.json()
    assert child["owner"] == "bob" and child["can_modify"] is True
    assert child["spec"]["resume"] == {"run_id": parent["id"], "step": 2}

    # the parent is untouched and still alice's; alice cannot cancel bob's resumed run
    got = team.get(f"/api/runs/{parent['id']}", headers=bob).json()
    assert got["owner"] == "alice" and got["status"] == "succeeded"
    assert got["can_modify"] is False
    assert team.post(f"/api/runs/{child['id']}/cancel", headers=alice).status_code == 403
    assert team.post(f"/api/runs/{child['id']}/cancel", headers=bob).status_code == 200

    # a viewer reads the checkpoints but starts nothing
    assert team.get(f"/api/runs/{parent['id']}/checkpoints", headers=viewer).json()[0][
        "step"] == 2
    r = team.post(f"/api/runs/{parent['id']}/resume", json={"step": 2}, headers=viewer)
    assert r.status_code == 403, r.text
