"""The Perfetto / Chrome-trace export follows the Trace Event Format strictly; CSV of tables."""

import csv
import io
import json
import shutil

from jobs.analysis import assign_lanes, tables_to_csv, to_perfetto, write_analysis
from jobs.analysis.export import iter_perfetto_json
from jobs.analysis.perfetto import iter_perfetto_columnar
from jobs.analysis.storage.convert import convert_run_dir
from tests.analysis import tef
from tests.analysis.synth import comm, end, mem, meta, span, write


def test_lanes_nest_perfectly():
    spans = [(0, 10, "a"), (2, 5, "b"), (4, 12, "c"), (5, 6, "d"), (10, 11, "e")]
    lanes = dict((item, lane) for lane, item in assign_lanes(spans))
    assert lanes["a"] == lanes["b"] == lanes["d"] == lanes["e"] == 0
    assert lanes["c"] == 1


def synthetic():
    recs = {}
    for r in range(2):
        recs[r] = [meta(r, 2), span(r, 0, "step", 0, 100, cat="step"),
                   span(r, 0, "forward", 1, 30), span(r, 0, "backward", 30, 70),
                   comm(r, 0, "all_reduce", 40, 90, n=2, payload=1000, bucket=0, seq=0),
                   comm(r, 0, "all_reduce", 60, 95, n=2, payload=1000, bucket=1, seq=1),
                   span(r, 0, "grad_sync", 70, 96, cat="comm"),
                   span(r, 0, "wait_grads", 71, 95, cat="comm_wait"),
                   mem(r, 0, 99, params=10, grads=10, optimizer=20, rss_bytes=5000),
                   {"type": "instant", "rank": r, "step": 0, "microbatch": None,
                    "name": "marker", "ts_ns": 50_000}, end(r, 120)]
    return recs


def test_synthetic_export_is_strict_tef():
    trace = to_perfetto(synthetic())
    info = tef.check(trace, 2)
    assert info["counters"] == {0: 2, 1: 2}
    names = {(e["pid"], e["args"]["name"]) for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "thread_name"}
    assert (0, "comm dp") in names and (0, "comm dp #2") in names   # overlapping buckets
    x = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["name"] == "forward"][0]
    assert x["ts"] == 1.0 and x["dur"] == 29.0                      # µs from the first record


def test_csv_of_a_table_round_trips():
    tables = {"t": [{"a": 1, "b": None, "c": {"pp": 0}}, {"a": 2.5, "d": "x"}]}
    rows = list(csv.DictReader(io.StringIO(tables_to_csv(tables, "t"))))
    assert list(rows[0]) == ["a", "b", "c", "d"]
    assert rows[0] == {"a": "1", "b": "", "c": '{"pp":0}', "d": ""}
    assert rows[1]["a"] == "2.5"


def test_real_4_rank_run_export_is_strict_tef(zero3_run, tmp_path):
    """A real run's document, streamed rank by rank from its Parquet traces (a copy: the
    fixture's folder is shared), the way GET /export builds it; no analysis writes one."""
    run = tmp_path / "run"
    shutil.copytree(zero3_run, run)
    headline = write_analysis(run)
    assert "analysis_error" not in headline and not (run / "trace.perfetto.json").exists()
    convert_run_dir(run)
    trace = json.loads("".join(iter_perfetto_columnar(run, chunk=7)))
    info = tef.check(trace, 4)
    assert info["spans"] > 0 and set(info["counters"]) == {0, 1, 2, 3}
    mem = [e for e in trace["traceEvents"] if e["ph"] == "C" and e["name"] == "memory"]
    assert mem and all({"params", "grads", "optimizer"} <= set(e["args"]) for e in mem)
    labels = {e["pid"]: e["args"]["labels"] for e in trace["traceEvents"]
              if e["name"] == "process_labels"}
    assert labels[3] == "pp=0,dp=3,tp=0"
    assert trace["otherData"]["spec"]["parallel"]["zero_stage"] == 3
    assert set(trace["otherData"]["ranks"]) == {"0", "1", "2", "3"}


def test_window_keeps_the_records_overlapping_it_on_the_runs_clock():
    whole = to_perfetto(synthetic())
    part = to_perfetto(synthetic(), window_ms=(0.035, 0.065))  # 35-65 µs of a 120 µs run
    tef.check(part, 2)
    names = sorted({e["name"] for e in part["traceEvents"] if e["ph"] in ("X", "i")})
    assert names == ["all_reduce", "backward", "marker", "step"]  # forward (1-30 µs) is out
    back = [e for e in part["traceEvents"] if e["ph"] == "X" and e["name"] == "backward"][0]
    assert back["ts"] == 30.0  # still from the run's origin: lines up with the whole trace
    assert part["otherData"]["t0_ns"] == whole["otherData"]["t0_ns"]
    assert part["otherData"]["window_ms"] == [0.035, 0.065]
    assert not [e for e in part["traceEvents"] if e["ph"] == "C"]  # memory at 99 µs: out


def test_streamed_json_is_the_same_document():
    for window in (None, (0.035, 0.065)):
        text = "".join(iter_perfetto_json(synthetic(), window_ms=window, chunk=3))
        assert json.loads(text) == json.loads(json.dumps(to_perfetto(synthetic(),
                                                                     window_ms=window)))


def test_the_document_streamed_from_parquet_matches_the_hand_times(tmp_path, monkeypatch):
    """The synthetic run converted to Parquet and streamed rank by rank: its events at the
    times written by hand above (µs from the first record), the same on every rank; a window
    keeps the run's origin; a rank over the per-rank bound is refused before a byte."""
    import pytest

    from jobs.analysis import perfetto
    run = write(tmp_path / "run", synthetic())
    convert_run_dir(run)
    doc = json.loads("".join(iter_perfetto_columnar(run, chunk=2)))
    info = tef.check(doc, 2)
    assert info["counters"] == {0: 2, 1: 2}
    xs = {(e["pid"], e["name"]): (e["ts"], e["dur"]) for e in doc["traceEvents"]
          if e["ph"] == "X" and e["name"] in ("forward", "backward", "step")}
    assert xs == {(r, n): t for r in range(2) for n, t in (
        ("step", (0.0, 100.0)), ("forward", (1.0, 29.0)), ("backward", (30.0, 40.0)))}
    comms = sorted((e["pid"], e["ts"], e["dur"]) for e in doc["traceEvents"]
                   if e["ph"] == "X" and e["name"] == "all_reduce")
    assert comms == sorted((r, a, b) for r in range(2) for a, b in ((40.0, 50.0), (60.0, 35.0)))
    assert [e["pid"] for e in doc["traceEvents"] if e["name"] == "process_name"] == [0, 1]
    part = json.loads("".join(iter_perfetto_columnar(run, window_ms=(0.035, 0.065))))
    back = [e for e in part["traceEvents"] if e["ph"] == "X" and e["name"] == "backward"]
    assert [e["ts"] for e in back] == [30.0, 30.0]
    assert not [e for e in part["traceEvents"] if e["name"] == "forward"]
    monkeypatch.setattr(perfetto, "RANK_MAX_RECORDS", 5)
    with pytest.raises(ValueError, match="rank [01] holds 1[01] trace records"):
        next(iter_perfetto_columnar(run))


def test_scalars_of_every_step_are_counters():
    recs = synthetic()
    for r in recs:  # an untraced step: only its scalars record
        recs[r].insert(-1, {"type": "scalars", "rank": r, "step": 1, "microbatch": None,
                            "ts_ns": 110_000, "traced": False, "step_s": 0.5,
                            "tokens_per_s": 8.0, "rss_bytes": 1000, "loss": 2.5})
    trace = to_perfetto(recs)
    tef.check(trace, 2)
    got = [e for e in trace["traceEvents"] if e["name"] == "step scalars"]
    assert [(e["pid"], e["ts"], e["args"]) for e in got] == [
        (r, 110.0, {"step_s": 0.5, "tokens_per_s": 8.0, "loss": 2.5, "rss_bytes": 1000})
        for r in range(2)]


def test_streamed_file_is_strict_json_with_a_non_finite_loss(tmp_path):
    from jobs.analysis.export import write_perfetto
    recs = synthetic()
    recs[0].insert(1, span(0, 0, "step", 0, 100, cat="step", loss=float("nan")))
    write_perfetto(tmp_path / "t.json", recs)
    doc = json.loads((tmp_path / "t.json").read_text(),
                     parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    tef.check(doc, 2)
    steps = [e for e in doc["traceEvents"] if e["name"] == "step" and e["pid"] == 0]
    assert any("loss" in e["args"] and e["args"]["loss"] is None for e in steps)
    assert not list(tmp_path.glob("*.part"))
