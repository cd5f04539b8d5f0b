"""Quotas (issue 36 item 7; backend/quotas.py, docs/security.md "Quotas"), in-process on
SQLite and PostgreSQL: the admin's timeout bounds at submit (runs, sweep members, resumes),
per-user concurrent runs and slot-hours with a sweep counted whole, the admin's override over
the API and the CLI, local mode without quotas unless set. No test waits for time to pass:
the quota clock is injected and finished runs get their start and end by hand."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from backend import cli, crud, quotas
from backend.core.config import Settings, get_settings
from backend.core.db import get_sessionmaker
from backend.main import create_app
from backend.models import Run, Sweep
from jobs.spec import parse_spec
from tests.auth.conftest import FAST_ARGON2, PASSWORD, SECRET, Users

# The spec of item 7: a hang that nothing would stop for a week.
WEEK = {"preset": "dp-allreduce", "name": "holds a slot for a week",
        "model": {"arch": "mlp", "hidden": 8, "layers": 2}, "train": {"steps": 5},
        "runtime": {"hang_timeout_s": 0, "timeout_s": 604800},
        "faults": [{"kind": "hang", "ranks": [1], "step": 3, "op": "all_reduce"}]}
MLP = {"preset": "ddp", "model": {"arch": "mlp"}, "train": {"steps": 2}}  # world size 2
NOW = datetime(2030, 5, 1, 12, 0, tzinfo=UTC)
H = 3600.0


@pytest.fixture
def clock(monkeypatch):
    """The quota clock, set by the test (NOW at first)."""
    at = {"now": NOW}
    monkeypatch.setattr(quotas, "clock", lambda: at["now"])
    return at


def _app(tmp_path, db_url, **extra) -> TestClient:
    st = Settings(data_dir=tmp_path / "var", database_url=db_url, worker_token="w" * 40,
                  secret_key=SECRET, **FAST_ARGON2, **extra)
    return TestClient(create_app(st)), st


def _count(db_url, model) -> int:
    with get_sessionmaker(db_url)() as db:
        return db.scalar(select(func.count()).select_from(model))


def _by_loc(detail: list[dict]) -> dict:
    return {tuple(e["loc"]): e for e in detail}


def test_the_item7_spec_is_refused_naming_the_field_for_runs_sweeps_and_resumes(
        team, users, db_url):
    bob, root = users.create("bob"), users.create("root", role="admin")
    r = team.post("/api/runs", json=WEEK, headers=bob)
    assert r.status_code == 422, r.text[:300]
    errs = _by_loc(r.json()["detail"])
    timeout = errs[("body", "runtime", "timeout_s")]
    assert timeout["type"] == "quota"
    assert "at most 86400 s" in timeout["msg"] and "604800" in timeout["msg"]
    assert "PARALAB_QUOTA_MAX_TIMEOUT_S" in timeout["msg"]
    hang = errs[("body", "runtime", "hang_timeout_s")]["msg"]
    assert "at least 30 s" in hang and "turns the hang watch off" in hang
    assert "PARALAB_QUOTA_MIN_HANG_TIMEOUT_S" in hang
    assert _count(db_url, Run) == 0

    # A hang watch below the bound, a timeout within it: only the hang field is named.
    r = team.post("/api/runs", json={**WEEK, "runtime": {"hang_timeout_s": 5,
                                                         "timeout_s": 3600}}, headers=bob)
    assert r.status_code == 422
    assert [e["loc"] for e in r.json()["detail"]] == [["body", "runtime", "hang_timeout_s"]]

    # Every member of a sweep: the item-7 member is kept with its errors and not launched.
    body = {"name": "s", "base": MLP, "members": [WEEK, {"train": {"seed": 1}}]}
    r = team.post("/api/sweeps", json=body, headers=bob)
    assert r.status_code == 201, r.text
    first, second = r.json()["members"]
    assert {e["type"] for e in first["errors"]} == {"quota"} and first["run_id"] is None
    assert second["errors"] is None and second["run_id"]
    r = team.post("/api/sweeps", json={**body, "members": [WEEK]}, headers=bob)
    assert r.status_code == 422
    assert ["body", "members", 0, "runtime", "timeout_s"] in [e["loc"] for e in
                                                               r.json()["detail"]]
    assert _count(db_url, Run) == 1 and _count(db_url, Sweep) == 1

    # A resume asking for the week: its spec is checked as a submission is.
    parent = team.post("/api/runs", json=MLP, headers=bob).json()["id"]
    team.post(f"/api/runs/{parent}/cancel", headers=bob)
    r = team.post(f"/api/runs/{parent}/resume", json={
        "step": 1, "runtime": {"timeout_s": 604800}}, headers=bob)
    assert r.status_code == 422
    assert "at most 86400 s" in _by_loc(r.json()["detail"])[
        ("body", "runtime", "timeout_s")]["msg"]

    # Admins are exempt from the bounds in team mode (they set them).
    r = team.post("/api/runs", json=WEEK, headers=root)
    assert r.status_code == 201, r.text
    assert team.get("/api/users/root/limits", headers=root).json()["bounds_exempt"] is True


def test_local_mode_has_no_quotas_unless_set_and_0_turns_one_off(tmp_path, db_url, client):
    assert client.post("/api/runs", json=WEEK).status_code == 201
    lim = client.get("/api/users/local/limits").json()
    assert lim["mode"] == "local" and lim["max_slot_hours"] is None
    assert lim["max_timeout_s"] is None and lim["min_hang_timeout_s"] is None

    set_client, _ = _app(tmp_path / "b", db_url, quota_max_timeout_s=3600)
    with set_client as c:
        r = c.post("/api/runs", json=WEEK)
        assert r.status_code == 422
        assert [e["loc"] for e in r.json()["detail"]] == [["body", "runtime", "timeout_s"]]
        lim = c.get("/api/users/local/limits").json()
        assert (lim["max_timeout_s"], lim["min_hang_timeout_s"]) == (3600, None)
        assert lim["bounds_exempt"] is False  # the one local user is bound by what is set

    # In team mode a setting of 0 turns its bound off.
    off, st = _app(tmp_path / "c", db_url, auth="required", quota_max_timeout_s=0,
                   quota_min_hang_timeout_s=0, default_max_slot_hours=0)
    with off as team:
        r = team.post("/api/runs", json=WEEK, headers=Users(st).create("bob"))
        assert r.status_code == 201, r.text[:300]


def test_a_256_member_sweep_is_refused_whole(team, users, db_url):
    bob, root = users.create("bob"), users.create("root", role="admin")
    long_runs = {"name": "long", "base": {**MLP, "runtime": {"timeout_s": 86400}},
                 "grid": {"train.seed": list(range(256))}}
    # 256 x world size 2 x 24 h = 12,288 slot-hours against the team default of 500.
    r = team.post("/api/sweeps", json=long_runs, headers=bob)
    assert r.status_code == 403, r.text[:300]
    detail = r.json()["detail"]
    assert "max_slot_hours=500" in detail and "this sweep's 256 runs would reserve 12288.00"\
        in detail
    assert _count(db_url, Run) == 0 and _count(db_url, Sweep) == 0

    # The admin sets a concurrent-run limit; every member of a sweep counts against it.
    r = team.patch("/api/users/bob", json={"max_concurrent_runs": 4}, headers=root)
    assert r.status_code == 200 and r.json()["max_concurrent_runs"] == 4
    two = team.post("/api/sweeps", json={"name": "two", "base": MLP, "members": [{}, {}]},
                    headers=bob)
    assert two.status_code == 201
    lim = team.get("/api/users/bob/limits", headers=bob).json()
    assert lim["active_runs"] == 2 and lim["max_concurrent_runs"] == 4
    assert lim["slot_hours_reserved"] == pytest.approx(2 * 2 * 600 / H, abs=1e-3)
    short_runs = {**long_runs, "base": MLP}  # 256 x 2 x 600 s: 85 slot-hours, within 500
    r = team.post("/api/sweeps", json=short_runs, headers=bob)
    assert r.status_code == 403
    assert "max_concurrent_runs=4" in r.json()["detail"]
    assert "already have 2" in r.json()["detail"] and "adds 256" in r.json()["detail"]
    assert _count(db_url, Run) == 2 and _count(db_url, Sweep) == 1
    assert team.get("/api/users/bob/limits", headers=bob).json()["active_runs"] == 2


def _finished(db_url, owner: str, world: int, start: datetime, end: datetime) -> None:
    dp = {"parallel": {"dp": world}, "runtime": {"nproc_per_node": world}}
    spec = parse_spec({**MLP, **dp}, max_world_size=64)
    with get_sessionmaker(db_url)() as db:
        run = crud.create_run(db, spec, owner=owner, tags=[], notes="", commit=False)
        run.status, run.started_at, run.finished_at = "succeeded", start, end
        db.commit()


def test_slot_hours_refused_past_the_limit_and_accepted_after_the_window_moves(
        tmp_path, db_url, clock):
    app, st = _app(tmp_path, db_url, auth="required", quota_window_s=86400)
    users = Users(st)
    carol, root = users.create("carol"), users.create("root", role="admin")
    with app as team:
        r = team.patch("/api/users/carol", json={"max_slot_hours": 10}, headers=root)
        assert r.status_code == 200 and r.json()["max_slot_hours"] == 10
        # 4 ranks for 2 h, 23 h to 21 h ago: 8 slot-hours inside the 24 h window
        _finished(db_url, "carol", 4, NOW - timedelta(hours=23), NOW - timedelta(hours=21))
        # ... and one that left the window long ago
        _finished(db_url, "carol", 8, NOW - timedelta(days=3), NOW - timedelta(days=2))
        lim = team.get("/api/users/carol/limits", headers=carol).json()
        assert lim["slot_hours_used"] == pytest.approx(8.0)
        assert (lim["max_slot_hours"], lim["window_s"]) == (10, 86400)

        two_hours = {**MLP, "runtime": {"timeout_s": 7200}}  # world 2 x 2 h: 4 slot-hours
        r = team.post("/api/runs", json=two_hours, headers=carol)
        assert r.status_code == 403, r.text
        detail = r.json()["detail"]
        assert "max_slot_hours=10" in detail and "window of 1 day" in detail
        assert "used 8.00" in detail and "reserve 0.00" in detail
        assert "this run would reserve 4.00" in detail
        # down to 6 used: the run's first 1.5 h leave the window 1.5 h from now
        assert "frees up at 2030-05-01T13:30:00+00:00 (in 1.5 h)" in detail
        assert r.headers["retry-after"] == str(int(1.5 * H) + 1)
        assert _count(db_url, Run) == 2

        clock["now"] = NOW + timedelta(hours=1.5)
        r = team.post("/api/runs", json=two_hours, headers=carol)
        assert r.status_code == 201, r.text
        lim = team.get("/api/users/carol/limits", headers=carol).json()
        assert lim["slot_hours_used"] == pytest.approx(6.0)
        assert lim["slot_hours_reserved"] == pytest.approx(4.0) and lim["active_runs"] == 1
        # Now the queued run's reservation is what keeps a second one out.
        r = team.post("/api/runs", json=two_hours, headers=carol)
        assert r.status_code == 403 and "reserve 4.00" in r.json()["detail"]
        # (down to 2 used: 4 ranks x 0.5 h left of the finished run, at 14:30)
        assert "frees up at 2030-05-01T14:30:00+00:00 (in 1.0 h)" in r.json()["detail"]
        # A run that alone exceeds the limit says what to lower.
        r = team.post("/api/runs", json={**MLP, "runtime": {"timeout_s": 86400}},
                      headers=carol)
        assert r.status_code == 403 and "lower runtime.timeout_s" in r.json()["detail"]


def test_admin_sets_and_clears_slot_hours_over_the_api(team, users):
    bob, root = users.create("bob"), users.create("root", role="admin")
    alice = users.create("alice", max_slot_hours=3.5)
    assert team.get("/api/users/alice", headers=root).json()["max_slot_hours"] == 3.5
    assert team.get("/api/users/alice/limits", headers=alice).json()["max_slot_hours"] == 3.5
    assert team.get("/api/users/alice/limits", headers=bob).status_code == 403
    assert team.get("/api/users/nobody/limits", headers=root).status_code == 404
    assert team.patch("/api/users/bob", json={"max_slot_hours": 2},
                      headers=bob).status_code == 403
    for bad in (-1, "lots", 2e9):
        r = team.patch("/api/users/bob", json={"max_slot_hours": bad}, headers=root)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body",
                                                                         "max_slot_hours"]
    assert team.patch("/api/users/bob", json={"max_slot_hours": 0.25},
                      headers=root).json()["max_slot_hours"] == 0.25
    assert team.get("/api/users/bob/limits", headers=root).json()["max_slot_hours"] == 0.25
    r = team.post("/api/runs", json=MLP, headers=bob)  # 2 x 600 s = 0.33 slot-hours
    assert r.status_code == 403 and "max_slot_hours=0.25" in r.json()["detail"]
    r = team.patch("/api/users/bob", json={"max_slot_hours": None}, headers=root)
    assert r.json()["max_slot_hours"] is None  # back to the server default
    assert team.get("/api/users/bob/limits", headers=bob).json()["max_slot_hours"] == 500
    assert team.post("/api/runs", json=MLP, headers=bob).status_code == 201
    actions = [e["action"] for e in team.get("/api/audit", headers=root).json()]
    assert actions.count("user.update") == 2


def test_cli_sets_slot_hours(monkeypatch, capsys, tmp_path, db_url):
    monkeypatch.setenv("PARALAB_DATA_DIR", str(tmp_path / "var"))
    monkeypatch.setenv("DATABASE_URL", db_url)
    for k, v in FAST_ARGON2.items():
        monkeypatch.setenv(f"PARALAB_{k.upper()}", str(v))
    get_settings.cache_clear()
    try:
        def run(*argv, stdin=""):
            monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
            code = cli.main(list(argv))
            out = capsys.readouterr()
            return code, out.out, out.err
        assert run("users", "create", "bob", "--password-stdin", stdin=PASSWORD + "\n")[0] == 0
        assert run("users", "set", "bob", "--max-slot-hours", "12.5")[0] == 0
        code, out, _ = run("users", "list")
        assert code == 0 and "slot-hours<=12.5" in out
        code, _, err = run("users", "set", "bob", "--max-slot-hours", "nan")
        assert code == 2 and err.startswith("paralab: max_slot_hours: a number")
        with get_sessionmaker(db_url)() as db:
            assert crud.get_user(db, "bob").max_slot_hours == 12.5
        assert run("users", "set", "bob", "--max-slot-hours", "-1")[0] == 0
        with get_sessionmaker(db_url)() as db:
            assert crud.get_user(db, "bob").max_slot_hours is None
    finally:
        get_settings.cache_clear()


def test_frees_at_follows_the_window_piecewise():
    """Usage.frees_at without a database: three finished runs, a 10 h window."""
    t0 = NOW.timestamp()
    u = quotas.Usage(now=NOW, window_s=10 * H, active=0, reserved_s=0.0, finished=(
        (2, t0 - 9 * H, t0 - 8 * H),    # 2 slot-hours, leaves between +1 h and +2 h
        (1, t0 - 6 * H, t0 - 2 * H),    # 4 slot-hours, leaves between +4 h and +8 h
        (4, t0 - 12 * H, t0 - 9.5 * H)))  # 4 x 0.5 h inside now, gone at +0.5 h
    assert u.used_s == pytest.approx(8 * H)
    assert u.frees_at(8 * H) == NOW
    assert u.frees_at(6 * H) == NOW + timedelta(hours=0.5)
    assert u.frees_at(5 * H) == NOW + timedelta(hours=1.5)
    assert u.frees_at(4 * H) == NOW + timedelta(hours=2)
    assert u.frees_at(1 * H) == NOW + timedelta(hours=7)
    assert u.frees_at(0.0) == NOW + timedelta(hours=8)
    assert u.frees_at(-1.0) is None
