"""Issue 36, item 1 and item 5's /api/predict: no request can exhaust the service. POST
/api/advise counts its search against a budget (counts, not clocks) before it evaluates any
layout and says which bound and how to narrow; the search runs in a child process killed past
its wall-clock bound and held to its memory bound; advise, predict and the schedule explorer
count against a per-user rate limit (an injected clock here); a huge integer in a what-if is a
422 naming the field. No assertion on wall-clock time: CPU budgets, counts, states."""

from __future__ import annotations

import os
import re
import resource
import threading
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from backend.core.config import Settings
from backend.main import create_app
from backend.migrate import upgrade
from tests.auth.conftest import FAST_ARGON2, SECRET, Users
from tests.conftest import Service

GPT3B = {"arch": "gpt", "layers": 32, "hidden": 2560, "heads": 32, "seq_len": 2048,
         "vocab": 50304}
SEED004 = {"hosts": 8, "devices_per_host": 8, "device_memory_bytes": 80e9, "intra_GBps": 300,
           "inter_GBps": 25, "flops": 300e12}
ONE_HOST_8 = {**SEED004, "hosts": 1}  # GPT3B: 806 candidates, ~0.5 CPU-s
TIMED = {"arch": "timed", "layers": 4, "hidden": 8, "t_forward": 0.02,
         "t_backward_input": 0.01, "t_backward_weight": 0.01}
SMALL = {"hosts": 1, "devices_per_host": 4, "device_memory_bytes": 8e9, "intra_GBps": 2,
         "inter_GBps": 1}


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def make_client(tmp_path):
    """TestClients on SQLite with the given settings; their search processes end after."""
    from backend.services.advise import close_pools
    made = []

    def make(**overrides) -> TestClient:
        url = f"sqlite:///{tmp_path / f'p{len(made)}.db'}"
        upgrade(url)
        settings = Settings(data_dir=tmp_path / f"var{len(made)}", database_url=url,
                            worker_token="t" * 32, **overrides)
        c = TestClient(create_app(settings), raise_server_exceptions=False)
        made.append(c.__enter__())
        return c

    yield make
    for c in made:
        c.__exit__(None, None, None)
    close_pools()


def _advise(client, model=GPT3B, batch=512, cluster=ONE_HOST_8, **extra):
    return client.post("/api/advise", json={"model": model, "global_batch": batch,
                                            "cluster": cluster, **extra})


def _budget_errors(r) -> str:
    """The messages of a 422 from the search budget, one line per bound it is over."""
    assert r.status_code == 422, r.text
    for e in r.json()["detail"]:
        assert e["loc"] == ["body", "cluster"] and e["type"] == "search_budget", e
        assert "fix.tp" in e["msg"] and "devices_per_host" in e["msg"]  # how to narrow
    return "\n".join(e["msg"] for e in r.json()["detail"])


# --- the search budget -------------------------------------------------------------------------

@pytest.mark.parametrize("setting, bound, what, env", [
    ("advise_max_candidates", 100, "candidate layouts to evaluate",
     "PARALAB_ADVISE_MAX_CANDIDATES"),
    ("advise_max_sim_actions", 1000, "schedule-simulator actions",
     "PARALAB_ADVISE_MAX_SIM_ACTIONS"),
])
def test_a_search_over_its_budget_is_refused_naming_the_bound(make_client, setting, bound,
                                                               what, env):
    r = _advise(make_client(**{setting: bound}))
    msg = _budget_errors(r)
    assert f"{what}" in msg and f"over the bound of {bound} ({env})" in msg
    figure = int(re.search(r"search too large: (\d+) ", msg).group(1))
    assert figure > bound
    if setting == "advise_max_candidates":
        # the figure is what the unbounded search evaluates: considered minus pruned
        out = _advise(make_client()).json()
        n = out["counts"]
        assert figure == n["considered"] - sum(n["pruned"].values()) == 806


def test_counting_stops_at_the_layout_bound(make_client):
    msg = _budget_errors(_advise(make_client(advise_max_layouts=50)))
    assert "more than 50 layouts to enumerate" in msg and "PARALAB_ADVISE_MAX_LAYOUTS" in msg


def test_a_fixed_tp_or_pp_narrows_the_search_under_the_bound(make_client):
    client = make_client(advise_max_candidates=100)
    for fix in ({"tp": 8}, {"pp": 8}, {"tp": 2, "pp": 2, "zero_stage": 1}):
        r = _advise(client, fix=fix, top=500)
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["candidates"] and out["fix"] == fix
        assert all(c["layout"][k] == v for c in out["candidates"] for k, v in fix.items())
        assert 0 < out["search"]["candidates"] <= 100


@pytest.mark.parametrize("fix, loc", [({"tp": 3}, "tp"), ({"pp": 5}, "pp"),
                                      ({"tp": 128}, "tp"), ({"zero_stage": 4}, "zero_stage")])
def test_a_fixed_degree_is_checked_naming_it(make_client, fix, loc):
    r = _advise(make_client(), fix=fix)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["body", "fix", loc]


@pytest.mark.parametrize("compare_to, loc", [
    ([{"tp": 8, "pp": 2, "dp": 3, "micro_batch_size": 1}], ["compare_to", 0, "dp"]),
    ([{"tp": 8, "pp": 1, "dp": 1}], ["compare_to", 0, "micro_batch_size"]),
    ([{"tp": 8, "pp": 1, "dp": 1, "micro_batch_size": 1, "zero_stage": 9}],
     ["compare_to", 0, "zero_stage"]),
    ([{}] * 17, ["compare_to"]),
])
def test_compare_to_is_checked_naming_the_field(make_client, compare_to, loc):
    """Issue 38: the layouts to place are user input, each field checked (422 naming it)."""
    r = _advise(make_client(), compare_to=compare_to)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["body", *loc]


def test_compare_to_places_a_layout_with_its_rank(make_client):
    r = _advise(make_client(), fix={"tp": 8}, compare_to=[
        {"tp": 8, "pp": 1, "dp": 1, "micro_batch_size": 1}])
    assert r.status_code == 200, r.text
    [placed] = r.json()["compare_to"]
    assert placed["layout"]["microbatches"] == 512 and placed["rank"] >= 1
    assert placed["predicted"]["step_s"] > 0


WIDE = {"arch": "gpt", "layers": 720, "hidden": 55440, "heads": 720, "seq_len": 40320,
        "vocab": 50304}  # divisors everywhere: 381,003 layouts and 153,198 candidates


def _cpu_of(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.timeout(120)  # before the bound this request ran > 118 CPU-s and 4.4 GB
def test_an_840_by_12_request_is_refused_before_any_layout_is_evaluated(make_client):
    client = make_client()
    cluster = {**SEED004, "hosts": 840, "devices_per_host": 12}
    before = resource.getrusage(resource.RUSAGE_SELF)
    r = _advise(client, model=WIDE, batch=997_920, cluster=cluster)
    after = resource.getrusage(resource.RUSAGE_SELF)
    msg = _budget_errors(r)
    assert "more than 200000 layouts" in msg
    api_cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    assert api_cpu < 5.0  # the API process: it neither counted nor searched
    from backend.services.advise import search_pool
    pool = search_pool(client.app.state.settings)
    assert pool.last_pid != os.getpid() and pool.children() == [pool.last_pid]
    assert _cpu_of(pool.last_pid) < 10.0  # the child: counting only, stopped at the bound


# --- the process pool: outside the API, wall-clock and memory bounds ---------------------------

def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_the_search_runs_in_a_child_that_imports_no_torch(make_client):
    from backend.services.advise import search_pool
    client = make_client()
    assert _advise(client, model=TIMED, batch=8, cluster=SMALL).status_code == 200
    pool = search_pool(client.app.state.settings)
    heavy = pool.call(eval, "sorted(m for m in __import__('sys').modules if m.split('.')[0] "
                            "in ('torch', 'numpy', 'fastapi', 'sqlalchemy', 'pydantic', "
                            "'backend'))")
    assert heavy == []
    assert pool.last_pid != os.getpid() and pool.call(os.getpid) == pool.last_pid


def test_a_search_past_the_wall_clock_bound_is_killed_and_the_api_stays_up(make_client):
    from backend.services.advise import search_pool
    client = make_client(advise_timeout_s=0.05)  # SEED004 takes ~3 CPU-s
    r = _advise(client, cluster=SEED004)
    assert r.status_code == 422, r.text
    [e] = r.json()["detail"]
    assert e["type"] == "search_budget" and e["loc"] == ["body", "cluster"]
    assert "wall-clock bound of 0.05 s (PARALAB_ADVISE_TIMEOUT_S)" in e["msg"]
    pool = search_pool(client.app.state.settings)
    assert _gone(pool.last_pid) and pool.children() == [] and pool.busy() == 0
    assert client.get("/api/health/live").status_code == 200
    assert client.get("/api/runs").status_code == 200
    other = make_client()  # the default bounds: the same request is answered
    assert _advise(other, model=TIMED, batch=8, cluster=SMALL).status_code == 200


def test_a_search_past_the_memory_bound_ends_its_child_with_a_clear_error(make_client):
    from backend.services.advise import search_pool
    probe = make_client()  # what a search process holds after a small search (~25 MB)
    assert _advise(probe, model=TIMED, batch=8, cluster=SMALL).status_code == 200
    held = search_pool(probe.app.state.settings).call(
        eval, "int(open('/proc/self/status').read().split('VmSize:')[1].split()[0]) * 1024")
    bound = held + (16 << 20)  # 128 x 8 needs 30 MB more (its memos alone fill 32 MiB)
    client = make_client(advise_memory_bytes=bound)
    r = _advise(client, batch=1024, cluster={**SEED004, "hosts": 128})
    assert r.status_code == 422, r.text
    [e] = r.json()["detail"]
    assert e["type"] == "search_budget"
    assert f"memory bound of {bound} bytes (PARALAB_ADVISE_MEMORY_BYTES)" in e["msg"]
    pool = search_pool(client.app.state.settings)
    dead = pool.last_pid
    assert _gone(dead) and pool.children() == []
    r = _advise(client, model=TIMED, batch=8, cluster=SMALL)  # a fresh child under the bound
    assert r.status_code == 200, r.text
    assert pool.last_pid != dead


def test_a_request_finding_every_search_process_busy_gets_503_with_retry_after(make_client,
                                                                               tmp_path):
    from backend.services.advise import search_pool
    from tests.support.hold import until_exists
    client = make_client(advise_workers=1)
    pool = search_pool(client.app.state.settings)
    release = tmp_path / "release"  # the one process is held until the test has asked
    hold = threading.Thread(target=pool.call, args=(until_exists, str(release)))
    hold.start()
    try:
        for _ in range(400):  # until the one process is busy (a condition, not a duration)
            if pool.busy():
                break
            time.sleep(0.01)
        assert pool.busy() == 1
        r = _advise(client, model=TIMED, batch=8, cluster=SMALL)
        assert r.status_code == 503, r.text
        assert int(r.headers["retry-after"]) >= 1 and "PARALAB_ADVISE_WORKERS" in r.text
    finally:
        release.touch()
        hold.join()
    assert _advise(client, model=TIMED, batch=8, cluster=SMALL).status_code == 200


@pytest.mark.timeout(180)
def test_under_paralab_serve_the_search_runs_in_a_child_of_the_api(tmp_path):
    svc = Service(tmp_path, db_url=f"sqlite:///{tmp_path / 'p.db'}", redis_url=None,
                  extra_env={"PARALAB_ADVISE_MAX_CANDIDATES": "100"})
    try:
        svc.start_backend()
        body = {"model": TIMED, "global_batch": 8, "cluster": SMALL}
        r = svc.http.post("/api/advise", json=body)
        assert r.status_code == 200, r.text
        children = [p for p in Path("/proc").iterdir() if p.name.isdigit()
                    and _ppid(p) == svc.backend.pid
                    and b"jobs.theory.pool" in (p / "cmdline").read_bytes()]
        assert len(children) == 1
        r = svc.http.post("/api/advise", json={**body, "model": GPT3B, "global_batch": 512,
                                               "cluster": ONE_HOST_8})
        assert "PARALAB_ADVISE_MAX_CANDIDATES" in _budget_errors(r)
    finally:
        svc.close()


def _ppid(proc: Path) -> int | None:
    try:
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None


# --- the per-user rate limit (an injected clock) -----------------------------------------------

def _clocked(client) -> Clock:
    from backend.services.request_limits import RequestLimits
    clock = Clock()
    client.app.state.request_limits = RequestLimits(client.app.state.settings, clock=clock)
    return clock


def _throttled(r, limit: int, env: str) -> None:
    assert r.status_code == 429, r.text
    assert r.headers["retry-after"] == "61"  # the window (60 s) until the oldest leaves it
    assert f"at most {limit} " in r.json()["detail"] and env in r.json()["detail"]


def test_predict_and_the_explorer_share_a_per_user_rate_limit(make_client):
    client = make_client(rate_limit_compute=3)
    clock = _clocked(client)
    explore = {"schedule": "1f1b", "p": 4, "m": 8}
    assert client.post("/api/predict", json={"preset": "ddp"}).status_code == 200
    assert client.post("/api/predict", json={"preset": "nope"}).status_code == 422  # uncounted
    assert client.get("/api/schedules/explore", params=explore).status_code == 200
    assert client.get("/api/schedules/explore", params={**explore, "m": 7, "schedule":
                                                        "interleaved", "v": 2}).status_code == 422
    assert client.post("/api/predict", json={"preset": "zero2"}).status_code == 200
    _throttled(client.post("/api/predict", json={"preset": "ddp"}), 3,
               "PARALAB_RATE_LIMIT_COMPUTE")
    _throttled(client.get("/api/schedules/explore", params=explore), 3,
               "PARALAB_RATE_LIMIT_COMPUTE")
    clock.now += 60  # the window has passed
    assert client.post("/api/predict", json={"preset": "ddp"}).status_code == 200


def test_advise_has_its_own_rate_limit(make_client):
    client = make_client(rate_limit_advise=2)
    clock = _clocked(client)
    small = {"model": TIMED, "batch": 8, "cluster": SMALL}
    assert _advise(client, **small).status_code == 200
    assert _advise(client, **small, top=0).status_code == 422  # uncounted
    assert _advise(client, **{**small, "model": {**TIMED, "layers": 0}}).status_code == 422
    assert _advise(client, **small).status_code == 200
    _throttled(_advise(client, **small), 2, "PARALAB_RATE_LIMIT_ADVISE")
    assert client.post("/api/predict", json={"preset": "ddp"}).status_code == 200  # other kind
    clock.now += 59
    assert _advise(client, **small).status_code == 429
    clock.now += 1
    assert _advise(client, **small).status_code == 200


def test_the_rate_limit_is_per_user(tmp_path):
    url = f"sqlite:///{tmp_path / 'p.db'}"
    upgrade(url)
    settings = Settings(data_dir=tmp_path / "var", database_url=url, worker_token="w" * 40,
                        auth="required", secret_key=SECRET, rate_limit_compute=2, **FAST_ARGON2)
    users = Users(settings)
    alice, bob = users.create("alice"), users.create("bob")
    with TestClient(create_app(settings)) as client:
        _clocked(client)
        for _ in range(2):
            assert client.post("/api/predict", json={"preset": "ddp"},
                               headers=alice).status_code == 200
        _throttled(client.post("/api/predict", json={"preset": "ddp"}, headers=alice), 2,
                   "PARALAB_RATE_LIMIT_COMPUTE")
        assert client.post("/api/predict", json={"preset": "ddp"},
                           headers=bob).status_code == 200


# --- item 5: /api/predict with a huge integer --------------------------------------------------

WHATIF = {"params": 1e9, "dp": 1, "tp": 1, "pp": 2, "zero_stage": 0, "memory_model": "16psi"}


@pytest.mark.parametrize("body, loc", [
    ({**WHATIF, "pp": 10**20}, ["body", "pp"]),
    ({**WHATIF, "layers": 10**20, "hidden": 64, "heads": 4, "seq_len": 16,
      "micro_batch_size": 1}, ["body", "layers"]),
    ({"spec": {"preset": "ddp"}, "assumptions": {"pp": 10**20}}, ["body", "assumptions", "pp"]),
    ({"spec": {"preset": "pp-1f1b"}, "assumptions": {"layers": 10**20}},
     ["body", "assumptions", "layers"]),
])
def test_a_huge_integer_in_a_prediction_is_422_naming_the_field(make_client, body, loc):
    r = make_client().post("/api/predict", json=body)
    assert r.status_code == 422, r.text
    [e] = r.json()["detail"]
    assert e["loc"] == loc and "between 1 and" in e["msg"]
