"""POST /api/advise: the ranked table with specs, counts by reason, the queue's measured
bandwidth from its latest collective sweep, and 422s naming the field."""

import pytest

from backend import crud
from backend.core.db import get_sessionmaker
from jobs.spec import parse_spec

TIMED = {"arch": "timed", "layers": 4, "hidden": 8, "t_forward": 0.02,
         "t_backward_input": 0.01, "t_backward_weight": 0.01}
CLUSTER = {"hosts": 1, "devices_per_host": 4, "device_memory_bytes": 8e9, "intra_GBps": 2,
           "inter_GBps": 1}



def test_advise_ranked_table(client):
    r = client.post("/api/advise", json={"model": TIMED, "global_batch": 8,
                                         "cluster": CLUSTER, "top": 5})
    assert r.status_code == 200, r.text
    out = r.json()
    cands = out["candidates"]
    assert 1 <= len(cands) <= 5
    steps = [c["predicted"]["step_s"] for c in cands]
    assert steps == sorted(steps)
    for c in cands:
        parse_spec(c["spec"], max_world_size=4, require_available=True)
        assert set(c["predicted"]) >= {"compute_s", "bubble_s", "comm_s", "step_s"}
        assert c["rules"] and c["why"]
    n = out["counts"]
    assert n["fitting"] >= len(cands) and n["considered"] > n["fitting"]
    assert isinstance(n["invalid"], dict) and isinstance(n["pruned"], dict)


@pytest.mark.parametrize("patch, loc", [
    ({"cluster": {**CLUSTER, "device_memory_bytes": -1}}, ["body", "cluster",
                                                           "device_memory_bytes"]),
    ({"cluster": {**CLUSTER, "hosts": 0}}, ["body", "cluster", "hosts"]),
    ({"model": {"preset": "nope"}}, ["body", "model", "preset"]),
    ({"model": {**TIMED, "layers": 0}}, ["body", "model", "layers"]),
    ({"model": {"arch": "gpt"}}, ["body", "cluster", "flops"]),
    ({"global_batch": 0}, ["body", "global_batch"]),
    ({"top": 0}, ["body", "top"]),
    ({"cluster": {k: v for k, v in CLUSTER.items() if k != "intra_GBps"}},
     ["body", "cluster", "intra_GBps"]),
])
def test_advise_422_names_the_field(client, patch, loc):
    body = {"model": TIMED, "global_batch": 8, "cluster": CLUSTER, **patch}
    r = client.post("/api/advise", json=body)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == loc


def test_advise_queue_bandwidth_from_latest_sweep(client, settings):
    no_bw = {k: v for k, v in CLUSTER.items() if not k.endswith("GBps")}
    r = client.post("/api/advise", json={"model": TIMED, "global_batch": 8, "cluster": no_bw,
                                         "queue": "advq"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "queue"]
    sweep = client.post("/api/runs", json={"preset": "collective-sweep",
                                           "runtime": {"queue": "advq"}}).json()
    summary = {"results": [{"op": "all_reduce", "bytes": 1024, "busbw_GBps": 0.5, "n": 2},
                           {"op": "all_reduce", "bytes": 1 << 20, "busbw_GBps": 3.25, "n": 2}]}
    with get_sessionmaker(settings.db_url)() as db:
        crud.claim(db, sweep["id"], worker="w", task_id=None)
        crud.finish(db, sweep["id"], status="succeeded", exit_code=0, error=None,
                    summary=summary, provenance={})
    r = client.post("/api/advise", json={"model": TIMED, "global_batch": 8, "cluster": no_bw,
                                         "queue": "advq"})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["cluster"]["intra_GBps"] == 3.25 and out["cluster"]["inter_GBps"] == 3.25
    assert sweep["id"] in out["conventions"]["bandwidth"]
    assert all(c["spec"]["runtime"]["queue"] == "advq" for c in out["candidates"])
