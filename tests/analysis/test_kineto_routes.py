"""GET /api/runs/{id}/export?format=kineto: a zip of rank{R}.pt.trace.json, or one rank's
document with `rank`, from a run's JSON lines and from its Parquet traces alike; bad queries
are 422s naming the field."""

from __future__ import annotations

import io
import json
import zipfile

import pytest

from backend import crud
from backend.core.db import get_sessionmaker
from jobs.analysis import write_analysis
from jobs.analysis.storage.convert import convert_run_dir
from jobs.spec import parse_spec
from tests.analysis.synth import comm, end, meta, span, write

WORLD = 3


@pytest.fixture
def run_id(settings, client):
    with get_sessionmaker(settings.db_url)() as db:
        rid = crud.create_run(db, parse_spec({"preset": "ddp"}), owner="u", tags=[],
                              notes="").id
    recs = {r: [meta(r, WORLD, spec={"preset": "ddp"}),
                span(r, 0, "step", 0, 100, cat="step"), span(r, 0, "backward", 0, 60),
                comm(r, 0, "all_reduce", 10 * r + 20, 80, n=WORLD, payload=4096, bucket=0,
                     dtype="float32"),
                end(r, 120)] for r in range(WORLD)}
    write_analysis(write(settings.runs_dir / rid, recs, summary={"loss": [1.0]}))
    return rid


def _check_doc(doc: dict, rank: int) -> None:
    assert doc["distributedInfo"]["rank"] == rank
    assert doc["distributedInfo"]["world_size"] == WORLD
    kern = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    assert sorted(k["name"] for k in kern) == ["backward", "ncclDevKernel_AllReduce_gloo"]
    nccl = next(k for k in kern if k["name"].startswith("nccl"))
    assert nccl["args"]["In msg nelems"] == 1024 and nccl["dur"] == 80 - (10 * rank + 20)


@pytest.mark.parametrize("converted", [False, True])
def test_zip_and_one_rank(client, settings, run_id, converted):
    if converted:
        convert_run_dir(settings.runs_dir / run_id)
    r = client.get(f"/api/runs/{run_id}/export", params={"format": "kineto"})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/zip")
    assert f"paralab-{run_id}.kineto.zip" in r.headers["content-disposition"]
    zf = zipfile.ZipFile(io.BytesIO(r.content))
    assert zf.testzip() is None
    assert zf.namelist() == [f"rank{i}.pt.trace.json" for i in range(WORLD)]
    for i in range(WORLD):
        _check_doc(json.loads(zf.read(f"rank{i}.pt.trace.json")), i)
    one = client.get(f"/api/runs/{run_id}/export", params={"format": "kineto", "rank": 2})
    assert one.status_code == 200, one.text
    assert f"paralab-{run_id}-rank2.pt.trace.json" in one.headers["content-disposition"]
    assert one.json() == json.loads(zf.read("rank2.pt.trace.json"))


def test_bad_kineto_queries_name_the_field(client, settings, run_id):
    for params, field, words in [({"format": "kineto", "rank": WORLD}, "rank", "no rank 3"),
                                 ({"format": "kineto", "rank": -1}, "rank", ""),
                                 ({"format": "perfetto", "rank": 0}, "rank", "kineto only"),
                                 ({"format": "kineto", "t0_ms": 0, "t1_ms": 1}, "t0_ms",
                                  "perfetto only")]:
        r = client.get(f"/api/runs/{run_id}/export", params=params)
        assert r.status_code == 422, (params, r.text)
        errs = r.json()["detail"]
        assert any(e["loc"] == ["query", field] and words in e["msg"] for e in errs), r.text


def test_a_rank_too_large_is_refused_before_sending(client, settings, run_id, monkeypatch):
    from jobs.analysis import perfetto
    convert_run_dir(settings.runs_dir / run_id)
    monkeypatch.setattr(perfetto, "RANK_MAX_RECORDS", 3)
    r = client.get(f"/api/runs/{run_id}/export", params={"format": "kineto"})
    assert r.status_code == 422, r.text
    err = r.json()["detail"][0]
    assert err["loc"] == ["query", "rank"] and "more than one download" in err["msg"], err
