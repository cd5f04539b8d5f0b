"""GET /api/runs/{id}/metrics and /api/runs/{id}/export, in-process against SQLite and
PostgreSQL, with the analysis files written where the backend keeps a run's files."""

import csv
import io
import json

import pytest

from backend import crud
from backend.core.db import get_sessionmaker
from jobs.analysis import TABLES, write_analysis
from jobs.spec import parse_spec
from tests.analysis import tef
from tests.analysis.synth import comm, end, mem, meta, span, write


@pytest.fixture
def run_id(settings, client):
    with get_sessionmaker(settings.db_url)() as db:
        return crud.create_run(db, parse_spec({"preset": "ddp"}), owner="u", tags=[],
                               notes="").id


def analyzed(settings, run_id):
    recs = {r: [meta(r, 2, spec={"preset": "ddp"}), span(r, 0, "step", 0, 100, cat="step"),
                span(r, 0, "backward", 0, 60),
                comm(r, 0, "all_reduce", 10 * r + 20, 80, n=2, payload=4096, bucket=0),
                mem(r, 0, 90, params=100, grads=100, optimizer=200), end(r, 120)]
            for r in range(2)}
    out = write(settings.runs_dir / run_id, recs, summary={"loss": [1.0]})
    return write_analysis(out)


def test_metrics_404_before_analysis(client, run_id):
    r = client.get(f"/api/runs/{run_id}/metrics")
    assert r.status_code == 404 and "no analysis yet" in r.json()["detail"]
    assert client.get(f"/api/runs/{run_id}/export", params={"format": "json"}).status_code == 404
    assert client.get(f"/api/runs/{run_id}/export").status_code == 404
    assert client.get("/api/runs/nope/metrics").status_code == 404


def test_metrics_and_one_table(client, settings, run_id):
    headline = analyzed(settings, run_id)
    body = client.get(f"/api/runs/{run_id}/metrics").json()
    assert body["headline"] == headline and set(body["tables"]) == set(TABLES)
    one = client.get(f"/api/runs/{run_id}/metrics", params={"table": "collectives"}).json()
    assert one["table"] == "collectives" and one["rows"][0]["last_rank"] == 1
    page = client.get(f"/api/runs/{run_id}/metrics",
                      params={"table": "step_rank", "offset": 1, "limit": 5}).json()
    assert page["total"] == 2 and [r["rank"] for r in page["rows"]] == [1]


def test_bad_query_is_422_naming_the_field(client, settings, run_id):
    analyzed(settings, run_id)
    for url, params, field in [("export", {"table": "nope"}, "table"),
                               ("export", {"format": "xml"}, "format"),
                               ("export", {"format": "csv"}, "table"),
                               ("metrics", {"table": "nope"}, "table")]:
        r = client.get(f"/api/runs/{run_id}/{url}", params=params)
        assert r.status_code == 422, (url, params, r.text)
        assert any(e["loc"] == ["query", field] for e in r.json()["detail"]), r.text


def test_exports_download(client, settings, run_id):
    analyzed(settings, run_id)
    r = client.get(f"/api/runs/{run_id}/export")
    assert r.status_code == 200
    assert f"paralab-{run_id}.perfetto.json" in r.headers["content-disposition"]
    tef.check(r.json(), 2)
    r = client.get(f"/api/runs/{run_id}/export", params={"format": "csv", "table": "step_rank"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
    assert f"paralab-{run_id}-step_rank.csv" in r.headers["content-disposition"]
    rows = list(csv.DictReader(io.StringIO(r.text)))
    assert [(x["rank"], x["step"]) for x in rows] == [("0", "0"), ("1", "0")]
    r = client.get(f"/api/runs/{run_id}/export", params={"format": "json"})
    assert set(r.json()["tables"]) == set(TABLES)
    r = client.get(f"/api/runs/{run_id}/export", params={"format": "json", "table": "memory"})
    assert isinstance(r.json(), list) and r.json()


def test_a_converted_runs_document_is_streamed_from_parquet(client, settings, run_id,
                                                             monkeypatch):
    """No analysis writes a Perfetto file: a converted run's document is built on request
    from its Parquet traces (the same document as its JSON lines give), and a rank too large
    to build is refused with the window to use instead."""
    from jobs.analysis import perfetto
    from jobs.analysis.storage.convert import convert_run_dir
    analyzed(settings, run_id)
    run_dir = settings.runs_dir / run_id
    assert not (run_dir / "trace.perfetto.json").exists()
    from_lines = client.get(f"/api/runs/{run_id}/export").json()
    convert_run_dir(run_dir)
    r = client.get(f"/api/runs/{run_id}/export")
    assert r.status_code == 200 and r.json() == from_lines
    assert f"paralab-{run_id}.perfetto.json" in r.headers["content-disposition"]
    tef.check(r.json(), 2)
    monkeypatch.setattr(perfetto, "RANK_MAX_RECORDS", 3)
    r = client.get(f"/api/runs/{run_id}/export")
    assert r.status_code == 422, r.text
    err = r.json()["detail"][0]
    assert err["loc"] == ["query", "t0_ms"] and "export a window" in err["msg"], err


def test_perfetto_window_is_streamed_and_checked(client, settings, run_id):
    analyzed(settings, run_id)  # ranks' records in 0-120 µs
    r = client.get(f"/api/runs/{run_id}/export", params={"t0_ms": 0.0, "t1_ms": 0.015})
    assert r.status_code == 200, r.text
    assert f"paralab-{run_id}-0-0.015ms.perfetto.json" in r.headers["content-disposition"]
    doc = r.json()
    tef.check(doc, 2)
    assert doc["otherData"]["window_ms"] == [0.0, 0.015]
    assert {e["name"] for e in doc["traceEvents"] if e["ph"] == "X"} == {"step", "backward"}
    for params, field, words in [({"t0_ms": 1}, "t1_ms", "both"),
                                 ({"t1_ms": 1}, "t0_ms", "both"),
                                 ({"t0_ms": 2, "t1_ms": 1}, "t1_ms", "greater than"),
                                 ({"t0_ms": 0, "t1_ms": 1, "format": "json"}, "t0_ms",
                                  "perfetto only")]:
        r = client.get(f"/api/runs/{run_id}/export", params=params)
        assert r.status_code == 422, (params, r.text)
        e = r.json()["detail"][0]
        assert e["loc"] == ["query", field] and words in e["msg"], (params, e)


def test_metrics_join_the_latest_sweep_of_the_same_queue(client, settings, run_id):
    analyzed(settings, run_id)
    body = client.get(f"/api/runs/{run_id}/metrics").json()
    assert body["bandwidth_vs_sweep"] is None
    with get_sessionmaker(settings.db_url)() as db:
        sweep = crud.create_run(db, parse_spec({"preset": "collective-sweep"}), owner="u",
                                tags=[], notes="")
        sweep.status = "succeeded"
        sweep.summary = {"world_size": 2, "results": [
            {"op": "all_reduce", "algorithm": "builtin", "bytes": 1024, "n": 2,
             "busbw_GBps": 1.0, "correct": True},
            {"op": "all_reduce", "algorithm": "builtin", "bytes": 4096, "n": 2,
             "busbw_GBps": 2.0, "correct": True},
            {"op": "all_reduce", "algorithm": "ring", "bytes": 4096, "n": 2,
             "busbw_GBps": 9.0, "correct": True}]}
        db.commit()
        sweep_id = sweep.id
    join = client.get(f"/api/runs/{run_id}/metrics").json()["bandwidth_vs_sweep"]
    assert join["sweep_run_id"] == sweep_id
    (row,) = join["rows"]
    assert row["op"] == "all_reduce" and row["payload_bytes"] == 4096
    assert row["sweep_bytes"] == 4096 and row["sweep_busbw_GBps"] == 2.0
    assert row["ratio"] == pytest.approx(row["measured_busbw_GBps"] / 2.0)


def test_a_large_table_is_paged_from_its_parquet_file(client, settings, run_id,
                                                      monkeypatch):
    """The columnar scale path keeps large tables in `table-<name>.parquet` (analysis.json
    holds a sample): `?table=` pages the whole file and the CSV export writes every row."""
    from devtools.oracle import analyze_run_dir
    from jobs.analysis import engine, rows_to_csv
    from jobs.analysis import step_sweep as NS
    from jobs.analysis.storage import convert
    from tests.analysis.test_columnar import dp_tp_run
    run = dp_tp_run(settings.runs_dir / run_id, steps=6)
    convert.convert_run_dir(run)
    want = analyze_run_dir(run)["tables"]["collectives"]
    monkeypatch.setattr(engine, "JSON_ROWS", 4)
    monkeypatch.setattr(NS, "CHUNK_RECORDS", 60)  # several step ranges: several row groups
    assert "analysis_error" not in write_analysis(run)
    body = client.get(f"/api/runs/{run_id}/metrics").json()
    info = body["table_files"]["collectives"]
    assert info["rows"] == len(want) > 4 and len(body["tables"]["collectives"]) <= 4
    page = client.get(f"/api/runs/{run_id}/metrics",
                      params={"table": "collectives", "offset": 2, "limit": 3}).json()
    assert page["total"] == len(want)
    assert [(r["seq"], r["group"], r["start_ns"]) for r in page["rows"]] == [
        (r["seq"], r["group"], r["start_ns"]) for r in want[2:5]]
    text = client.get(f"/api/runs/{run_id}/export",
                      params={"format": "csv", "table": "collectives"}).text
    assert len(list(csv.DictReader(io.StringIO(text)))) == len(want)
    # streamed a row group at a time (several here: one per step range), the same text as
    # the one writer over the whole table's rows; JSON too
    import pyarrow.parquet as pq
    assert pq.ParquetFile(run / "table-collectives.parquet").metadata.num_row_groups > 1
    rows = engine.table_rows(run, "collectives")[1]
    assert text == rows_to_csv(rows)
    assert len({tuple(sorted(r)) for r in rows}) > 1  # rows differ in their optional keys
    got = client.get(f"/api/runs/{run_id}/export", params={"format": "json",
                                                           "table": "collectives"})
    assert got.text == json.dumps(rows)
