"""POST /api/advise with `queue` and no cluster.flops: the FLOP/s of the queue's latest compute
calibration (kind compute_bench), its source named; a 422 naming cluster.flops without one."""

import pytest

from backend import crud
from backend.core.db import get_sessionmaker

MLP = {"arch": "mlp", "layers": 4, "hidden": 64}
CLUSTER = {"hosts": 1, "devices_per_host": 2, "device_memory_bytes": 8e9, "intra_GBps": 2,
           "inter_GBps": 1}



def _finish(settings, run_id: str, summary: dict, status: str = "succeeded") -> None:
    with get_sessionmaker(settings.db_url)() as db:
        crud.claim(db, run_id, worker="w", task_id=None)
        crud.finish(db, run_id, status=status, exit_code=0 if status == "succeeded" else 1,
                    error=None, summary=summary, provenance={})


def _calibration(client, settings, queue: str, rate: float, status="succeeded") -> str:
    run = client.post("/api/runs", json={"preset": "compute-calibration",
                                         "runtime": {"queue": queue}})
    assert run.status_code == 201, run.text
    rid = run.json()["id"]
    _finish(settings, rid, {"kind": "compute_bench", "median_flops_per_s": rate,
                            "model": {"arch": "mlp", "hidden": 256}, "batch": 32,
                            "dtype": "float32", "world_size": 2, "device_name": "cpu",
                            "results": [{"rank": 0}, {"rank": 1}]}, status)
    return rid


def _advise(client, queue=None, model=MLP, cluster=CLUSTER):
    body = {"model": model, "global_batch": 8, "cluster": cluster}
    return client.post("/api/advise", json=body | ({"queue": queue} if queue else {}))


def test_queue_flops_from_latest_calibration(client, settings):
    old = _calibration(client, settings, "calq", 1e9)
    new = _calibration(client, settings, "calq", 2.5e9)
    _calibration(client, settings, "calq", 9e9, status="failed")  # newest, but not succeeded
    _calibration(client, settings, "otherq", 7e9)  # another pool's devices
    r = _advise(client, "calq")
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["cluster"]["flops"] == 2.5e9 and old not in out["cluster"]["flops_source"]
    src = out["cluster"]["flops_source"]
    assert src.startswith(f"median achieved FLOP/s of compute calibration run {new} on queue "
                          "'calq' (model shape mlp hidden 256")
    assert src in out["conventions"]["compute"]
    # given flops win over the calibration
    given = _advise(client, "calq", cluster={**CLUSTER, "flops": 1e12}).json()
    assert given["cluster"]["flops"] == 1e12 and "flops_source" not in given["cluster"]
    # compute scales with 1 / rate: the calibrated rate is the one used
    c1 = out["candidates"][0]
    c2 = next(c for c in given["candidates"] if c["label"] == c1["label"])
    assert c1["predicted"]["compute_s"] == pytest.approx(400 * c2["predicted"]["compute_s"])


@pytest.mark.parametrize("queue", [None, "emptyq"])
def test_gpt_mlp_without_flops_or_calibration_422(client, settings, queue):
    if queue:  # a sweep without results does not count either
        rid = client.post("/api/runs", json={"preset": "compute-calibration",
                                             "runtime": {"queue": queue}}).json()["id"]
        _finish(settings, rid, {"kind": "compute_bench", "median_flops_per_s": 1e9})
    for model in (MLP, {"arch": "gpt"}):
        r = _advise(client, queue, model=model)
        assert r.status_code == 422, r.text
        e = r.json()["detail"][0]
        assert e["loc"] == ["body", "cluster", "flops"]
        assert "compute-calibration" in e["msg"] and "FLOP/s" in e["msg"]
        if queue:
            assert repr(queue) in e["msg"]


def test_timed_needs_no_calibration(client):
    timed = {"arch": "timed", "layers": 4, "hidden": 8}
    r = _advise(client, "nocalq", model=timed)  # bandwidth given, no calibration on the queue
    assert r.status_code == 200, r.text
    assert "flops" not in r.json()["cluster"]
