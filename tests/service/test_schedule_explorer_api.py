"""GET /api/schedules/explore (the schedule explorer's API, issue 4) in-process: the simulated
schedule of a configuration, and a 422 naming the query field for every rule of
jobs.schedules. The route touches no database, so one SQLite app serves the module."""

from __future__ import annotations

from fractions import Fraction

import pytest
from fastapi.testclient import TestClient

from backend.api.routes.schedules import MAX_PVM
from backend.core.config import Settings
from backend.main import create_app
from backend.migrate import upgrade
from jobs.schedules import CONVENTION, SCHEDULES


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sched")
    url = f"sqlite:///{tmp}/s.db"
    upgrade(url)
    settings = Settings(data_dir=tmp / "var", database_url=url, worker_token="t" * 32)
    with TestClient(create_app(settings)) as c:
        yield c


def explore(client, **params):
    return client.get("/api/schedules/explore", params=params)


def the_422(r, field: str) -> dict:
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert isinstance(detail, list) and detail, detail
    hits = [e for e in detail if e["loc"] == ["query", field]]
    assert hits, detail
    assert set(hits[0]) >= {"loc", "msg", "type"}
    return hits[0]


def test_lists_schedules_limits_and_defaults(client):
    info = client.get("/api/schedules").json()
    assert info["schedules"] == list(SCHEDULES)
    assert info["placements"]["zbv"] == "v" and info["placements"]["1f1b"] == "loop"
    assert info["limits"]["p*v*m"]["max"] == MAX_PVM
    assert info["defaults"]["schedule"] in SCHEDULES and info["convention"] == CONVENTION


def test_1f1b_bubble_matches_the_closed_form(client):
    r = explore(client, schedule="1f1b", p=4, m=8)
    assert r.status_code == 200, r.text
    d = r.json()
    assert Fraction(d["bubble_fraction"]).limit_denominator(1000) == Fraction(3, 11)
    assert d["closed_form"]["total"] == pytest.approx(3 / 11)
    assert d["bubble_fraction"] == pytest.approx(d["closed_form"]["total"])
    assert d["bubble_over_ideal"] == pytest.approx(3 / 8) == d["closed_form"]["ideal"]
    assert d["makespan_s"] == pytest.approx(11 * 3)  # (m+p-1) (t_f + t_b_input + t_b_weight)
    assert d["placement"] == "loop" and d["convention"] == CONVENTION
    assert len(d["ranks"]) == len(d["actions"]) == 4
    assert [r["stages"] for r in d["ranks"]] == [[0], [1], [2], [3]]
    assert d["actions"][0][:5] == ["F0", "F1", "F2", "F3", "BW0"]
    for rank, acts in zip(d["ranks"], d["actions"], strict=True):
        assert len(rank["spans"]) == len(acts) == 2 * 8
        assert {s["kind"] for s in rank["spans"]} == {"F", "BW"}
    assert [r["peak_inflight_microbatches"] for r in d["ranks"]] == [4, 3, 2, 1]


def test_zbv_uses_the_v_placement(client):
    d = explore(client, schedule="zbv", p=2, m=4, v=2).json()
    assert d["bubble_fraction"] == pytest.approx(0.04)
    assert d["closed_form"] is None and d["split_backward"] is True
    assert d["placement"] == "v"
    assert [r["stages"] for r in d["ranks"]] == [[0, 3], [1, 2]]
    assert {s["kind"] for r in d["ranks"] for s in r["spans"]} == {"F", "B", "W"}
    assert "F0c1" in d["actions"][0]


def test_times_shape_the_schedule(client):
    d = explore(client, schedule="gpipe", p=2, m=2, t_f=1, t_b_input=2, t_b_weight=0.5,
                t_comm=0.25).json()
    assert d["times"]["t_comm"] == 0.25
    bw = [s for s in d["ranks"][0]["spans"] if s["kind"] == "BW"]
    assert bw and all(s["end"] - s["start"] == pytest.approx(2.5) for s in bw)
    assert d["closed_form"] is None  # t_comm > 0: no textbook figure


@pytest.mark.parametrize("params,field,fragment", [
    ({"schedule": "foo", "p": 4, "m": 8}, "schedule", "one of"),
    ({"schedule": "zbv", "p": 2, "m": 4, "v": 1}, "v", "v = 2"),
    ({"schedule": "zbv", "p": 2, "m": 4}, "v", "v = 2"),  # no v defaults to 1, not 2
    ({"schedule": "1f1b", "p": 4, "m": 8, "v": 2}, "v", "interleaved"),
    ({"schedule": "interleaved", "p": 4, "m": 6, "v": 2}, "m", "multiple of p"),
    ({"schedule": "1f1b", "p": 64, "m": 512}, "m", f"p*v*m must be <= {MAX_PVM}"),
    ({"schedule": "interleaved", "p": 16, "m": 128, "v": 16}, "m", "p*v*m"),
    ({"schedule": "1f1b", "p": 4, "m": 8, "t_f": -1}, "t_f", ""),
    ({"schedule": "1f1b", "p": 4, "m": 8, "t_comm": "inf"}, "t_comm", ""),
    ({"schedule": "1f1b", "p": 0, "m": 8}, "p", ""),
    ({"schedule": "1f1b", "p": 65, "m": 8}, "p", ""),
    ({"schedule": "1f1b", "p": 4}, "m", ""),
])
def test_invalid_configurations_are_a_422_naming_the_field(client, params, field, fragment):
    err = the_422(explore(client, **params), field)
    assert fragment in err["msg"], err
    if fragment:  # our own rules use FastAPI's value_error type
        assert err["type"] == "value_error"


def test_bound_is_inclusive(client):
    r = explore(client, schedule="gpipe", p=40, m=500)  # p*m = MAX_PVM
    assert 40 * 500 == MAX_PVM and r.status_code == 200, r.text[:300]
