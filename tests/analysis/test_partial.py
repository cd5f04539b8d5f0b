"""A cancelled / killed / failed run's partial traces degrade the analysis, never raise."""

import json

from devtools.oracle import analyze_run_dir
from jobs.analysis import load_run_dir, to_perfetto, write_analysis
from tests.analysis import tef
from tests.analysis.synth import comm, end, meta, span, write


def test_empty_folder(tmp_path):
    h = write_analysis(tmp_path)
    assert "analysis_error" not in h and h["step_time_s"] is None
    a = json.loads((tmp_path / "analysis.json").read_text())
    assert any("no trace-rank" in w for w in a["warnings"])
    assert all(rows == [] for name, rows in a["tables"].items() if name != "headline")
    assert a["tables"]["headline"] == [h] and h["steps"] == 0 and h["steady_steps"] is None


def test_torn_lines_missing_rank_no_end_unfinished_step(tmp_path):
    spec = {"preset": "ddp", "parallel": {"dp": 3}, "runtime": {"nproc_per_node": 3},
            "train": {"global_batch": 6}}
    r0 = [meta(0, 3, spec=spec), span(0, 0, "step", 0, 100, cat="step"),
          span(0, 0, "forward", 0, 40), comm(0, 0, "all_reduce", 40, 90, n=3, payload=3000),
          span(0, 1, "forward", 100, 140),                      # step 1 never finished
          comm(0, 1, "all_reduce", 140, 150, n=3, payload=3000, seq=1)]
    r1 = [meta(1, 3, spec=spec), span(1, 0, "step", 0, 100, cat="step"),
          comm(1, 0, "all_reduce", 45, 90, n=3, payload=3000), end(1, 200)]
    write(tmp_path, {0: r0, 1: r1})
    with open(tmp_path / "trace-rank1.jsonl", "a") as f:
        f.write('{"type": "span", "name": "torn')                # torn last line
    (tmp_path / "trace-rank2.jsonl").write_text("")              # killed before the meta line
    a = analyze_run_dir(tmp_path)
    w = " | ".join(a["warnings"])
    assert "rank 0: no end record" in w and "rank 1: 1 unreadable" in w
    assert "no trace for rank(s) [2]" in w and "fewer ranks" in w
    assert "without a `step` span" in w
    t = a["tables"]
    assert {(r["rank"], r["step"]) for r in t["step_rank"]} == {(0, 0), (0, 1), (1, 0)}
    assert all(not r["complete"] for r in t["collectives"])
    assert a["headline"]["step_time_s"] is not None
    write_analysis(tmp_path)
    tef.check(to_perfetto(load_run_dir(tmp_path)), 2)  # what GET /export streams


def test_garbage_records_do_not_raise(tmp_path):
    (tmp_path / "trace-rank0.jsonl").write_text(
        '[1, 2]\n{"type": "span", "ts_ns": "x"}\n{"type": "comm", "ts_ns": 5}\n'
        '{"type": "mem", "ts_ns": 7, "params": "lots"}\n{"type": "weird", "ts_ns": 1}\n')
    h = write_analysis(tmp_path)
    assert "analysis_error" not in h
    a = json.loads((tmp_path / "analysis.json").read_text())
    assert a["warnings"]


def test_line_rules_of_the_json_reader():
    """Each line is one JSON object or one bad line; these are the edges a faster decoder
    (raw_decode, not loads) must keep: trailing data, two objects on a line, non-objects,
    untimed or negative-duration timed records, bool / str stamps, a list-valued type."""
    from jobs.analysis.storage.jsonl import _parse
    good = ['{"type":"span","ts_ns":5,"dur_ns":2}', '  {"type":"weird"}  ',
            '{"type":"mem","ts_ns":1,"optim":7}', '{"type":["span"]}',
            '{"type":"comm","ts_ns":2.5}']
    bad = ['{"a":1} x', '{"a":1}{"b":2}', "[1]", '"s"', "null", "3",
           '{"type":"span","dur_ns":1}', '{"type":"span","ts_ns":1,"dur_ns":-1}',
           '{"type":"end","ts_ns":"9"}', '{"type":"instant","ts_ns":1,"dur_ns":"2"}', "{",
           '\ufeff{"a":1}']
    lines = [good[0], '{"type":"meta","rank":0}', *bad, "", *good[1:], '{"type":"meta","rank":1}']
    recs, meta, nbad, empty = _parse(x + "\n" for x in lines)
    assert (nbad, empty, meta) == (len(bad), False, {"type": "meta", "rank": 1})  # last meta wins
    assert [r.get("ts_ns", 0) for r in recs] == [0, 0, 1, 2.5, 5]  # sorted by ts, stable
    assert {"type": "mem", "ts_ns": 1, "optimizer": 7} in recs  # the pre-issue-12 name
    assert _parse(["", "  \n"]) == ([], {}, 0, True)
