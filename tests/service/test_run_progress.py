"""What GET /api/runs/{id} adds for the run page's first screen (issue 37), in-process: the last
progress from the stored log (the newest end-of-step line, else the newest line of a rank),
the reason a queued run waits (the cluster page's), every parallel degree (ep and cp columns,
migration 0011 backfilling them from the stored spec), and the diagnosis' failure text that
puts the culprit before the ranks that only lost their peer."""

from __future__ import annotations

import sqlalchemy as sa

from backend import crud
from backend.core.db import get_sessionmaker
from jobs.analysis.diagnose import failure_text


def test_last_progress_is_the_newest_step_line(client, settings):
    rid = client.post("/api/runs", json={"preset": "ddp", "name": "p"}).json()["id"]
    queued = client.get(f"/api/runs/{rid}").json()
    assert queued["progress"] is None and queued["wait_reason"]  # no worker serves its queue
    with get_sessionmaker(settings.db_url)() as db:
        crud.claim(db, rid, worker="w", task_id=None)
        crud.append_logs(db, rid, [
            {"seq": 0, "line": "[paralab] launching", "ts": "2026-01-01T00:00:00Z"},
            {"seq": 1, "line": "[default0]:step 0 loss 1.0", "ts": "2026-01-01T00:00:01Z"},
            {"seq": 2, "line": "[default1]:step 1 loss 0.9", "ts": "2026-01-01T00:00:02Z"},
            {"seq": 3, "line": "[default0]:[rank0]: Traceback", "ts": "2026-01-01T00:00:05Z"}])
    run = client.get(f"/api/runs/{rid}").json()
    assert run["wait_reason"] is None
    p = run["progress"]
    assert (p["kind"], p["step"], p["rank"]) == ("step", 1, 1)
    assert p["at"].startswith("2026-01-01T00:00:02") and p["age_s"] > 0


def test_a_run_without_a_step_line_progresses_by_its_ranks_lines(client, settings):
    rid = client.post("/api/runs", json={"preset": "ddp", "name": "p"}).json()["id"]
    with get_sessionmaker(settings.db_url)() as db:
        crud.claim(db, rid, worker="w", task_id=None)
        crud.append_logs(db, rid, [
            {"seq": 0, "line": "[default1]:loading", "ts": "2026-01-01T00:00:03Z"}])
    p = client.get(f"/api/runs/{rid}").json()["progress"]
    assert (p["kind"], p["step"], p["rank"]) == ("log", None, 1)


def test_the_api_has_every_degree(client):
    run = client.post("/api/runs", json={"preset": "cp", "name": "c"}).json()
    assert (run["dp"], run["cp"], run["ep"]) == (2, 2, 1)
    listed = client.get("/api/runs").json()["items"][0]
    assert listed["cp"] == 2


def test_migration_0011_backfills_ep_and_cp_from_the_spec(tmp_path):
    from alembic import command

    from backend.migrate import alembic_config, upgrade
    url = f"sqlite:///{tmp_path / 'old.db'}"
    command.upgrade(alembic_config(url), "0010")
    eng = sa.create_engine(url)
    with eng.begin() as c:
        for rid, spec in (("r1", '{"parallel": {"dp": 2, "cp": 2}}'), ("r2", "{}"),
                          ("r3", '{"parallel": {"ep": 4, "cp": "x"}}')):
            c.execute(sa.text(
                "INSERT INTO runs (id, name, owner, kind, strategy, spec, spec_version, "
                "world_size, dp, tp, pp, queue, status, created_at, cancel_requested, notes) "
                f"VALUES ('{rid}', 'old', 'local', 'train', 'ddp', '{spec}', 1, 2, 2, 1, 1, "
                "'default', 'succeeded', '2026-01-01 00:00:00', 0, '')"))
    upgrade(url)
    with eng.begin() as c:
        rows = dict((r[0], (r[1], r[2])) for r in c.execute(
            sa.text("SELECT id, ep, cp FROM runs ORDER BY id")))
    eng.dispose()
    assert rows == {"r1": (1, 2), "r2": (1, 1), "r3": (4, 1)}


def test_the_failure_text_leads_with_the_culprit_and_groups_the_victims():
    peer = ("RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:{}. "
            "This is typically caused by a remote worker crashing.")
    d = {"left": [
        {"rank": 1, "last_words": "InjectedCrash: boom", "lost_peer": False},
        {"rank": 2, "last_words": peer.format(4001), "lost_peer": True},
        {"rank": 0, "last_words": peer.format(4002), "lost_peer": True}],
        "errors": {1: "rank 1: InjectedCrash: boom\n\nTraceback ...\nInjectedCrash: boom",
                   0: "rank 0: " + peer.format(4002)}}
    text = failure_text(d)
    assert text.startswith("rank 1: InjectedCrash: boom\n\nTraceback")
    assert text.count("closed by peer") == 1
    assert text.endswith("ranks 0, 2 lost their peer: " + peer.format(4001).replace(
        "[127.0.0.1]:4001", "[…]"))
    assert failure_text({"left": []}) is None
