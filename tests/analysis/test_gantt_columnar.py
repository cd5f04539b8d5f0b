"""The Gantt of a converted run (backend/services/gantt_columnar.py): a window's
records from the Parquet files give the same segments as the whole loaded trace's Gantt
(backend/services/gantt.py, the oracle), on the run's time origin and its full step list."""

from __future__ import annotations

import pytest

from backend.services import gantt, gantt_columnar
from jobs.analysis import load_run_dir
from jobs.analysis.storage import convert
from tests.analysis.test_columnar import dp_tp_run


def segments(out: dict) -> list[tuple]:
    """(rank, lane label, t0, t1, span label, n) of an answer, order-free."""
    lanes = {ln["id"]: ln["channel"] for ln in out["lanes"]}
    s = out["segments"]
    return sorted(zip(s["rank"], [lanes[x] for x in s["lane"]], s["t0"], s["t1"],
                      [out["keys"][k] for k in s["key"]], s["n"], strict=True))


def test_a_step_window_equals_the_whole_traces_gantt(tmp_path, monkeypatch):
    run = dp_tp_run(tmp_path / "run", steps=5, drop=(1, 2))
    convert.convert_run_dir(run)
    full = gantt.columns(load_run_dir(run))
    for step in (0, 2, 4):
        want = gantt.gantt(full, step=step)
        got = gantt_columnar.answer(run, step=step, t0_ms=None, t1_ms=None, max_spans=20000,
                                    px=2000)
        assert got["steps"] == want["steps"] and got["window"] == want["window"]
        assert segments(got) == segments(want) and got["total_spans"] == want["total_spans"]
    # opened with no window: the whole run, as the loaded traces' Gantt opens
    opened = gantt_columnar.answer(run, step=None, t0_ms=None, t1_ms=None, max_spans=20000,
                                   px=2000)
    whole = gantt.gantt(full)
    assert opened["lod"]["shown_step"] is None and opened["window"] == whole["window"]
    assert segments(opened) == segments(whole) and opened["total_spans"] == whole["total_spans"]
    # a run of more records than one answer reads opens on its middle step instead
    monkeypatch.setattr(gantt_columnar, "MAX_RECORDS", 10)
    opened = gantt_columnar.answer(run, step=None, t0_ms=None, t1_ms=None, max_spans=20000,
                                   px=2000)
    assert opened["lod"]["shown_step"] == 2  # the middle step, not the whole run
    assert segments(opened) == segments(gantt.gantt(full, step=2))


def test_a_time_window_is_capped_in_records(tmp_path, monkeypatch):
    run = dp_tp_run(tmp_path / "run", steps=6)
    convert.convert_run_dir(run)
    full = gantt.columns(load_run_dir(run))
    lo, hi = full.steps[1]["t0_ms"], full.steps[3]["t1_ms"]
    got = gantt_columnar.answer(run, step=None, t0_ms=lo, t1_ms=hi, max_spans=20000, px=2000)
    assert segments(got) == segments(gantt.gantt(full, t0_ms=lo, t1_ms=hi))
    assert not got["lod"]["window_capped"]
    monkeypatch.setattr(gantt_columnar, "MAX_RECORDS", 10)
    capped = gantt_columnar.answer(run, step=None, t0_ms=lo, t1_ms=hi, max_spans=20000,
                                   px=2000)
    assert capped["lod"]["window_capped"] and capped["lod"]["window_records"] > 10
    assert lo <= capped["window"]["t1_ms"] < hi
    assert capped["total_spans"] < got["total_spans"]


def test_a_perfetto_window_from_parquet_equals_the_loaded_traces(tmp_path, monkeypatch):
    import json

    import pytest

    from jobs.analysis.export import iter_perfetto_json
    run = dp_tp_run(tmp_path / "run", steps=5)
    convert.convert_run_dir(run)
    full = load_run_dir(run)
    steps = gantt.columns(full).steps
    win = (steps[1]["t0_ms"] + 0.05, steps[2]["t1_ms"])
    tr, origin = gantt_columnar.export_window(run, *win)
    got = json.loads("".join(iter_perfetto_json(tr, None, window_ms=win, origin=origin)))
    want = json.loads("".join(iter_perfetto_json(full, None, window_ms=win)))
    assert got == want and len(got["traceEvents"]) > 20
    monkeypatch.setattr(gantt_columnar, "EXPORT_MAX_RECORDS", 5)
    with pytest.raises(ValueError, match="narrow it"):
        gantt_columnar.export_window(run, *win)


def test_a_long_run_lists_a_bounded_step_selection(monkeypatch):
    steps = [{"step": s, "t0_ms": float(s), "t1_ms": s + 1.0} for s in range(1000)]
    monkeypatch.setattr(gantt_columnar, "MAX_STEPS", 100)
    got = gantt_columnar.listed_steps(steps, keep=555)
    assert len(got) <= 101 and [s["step"] for s in got] == sorted(s["step"] for s in got)
    assert 555 in [s["step"] for s in got] and got[0]["step"] == 0
    assert gantt_columnar.listed_steps(steps[:50]) == steps[:50]


def test_a_converted_runs_json_lines_are_never_loaded_and_its_page_warms_the_step_list(
        tmp_path):
    """Its JSON lines stay next to the Parquet files, but run_traces never parses them, at any
    size (a 50 M-record run would not fit in the server's memory, and a small one would stay
    in it); opening the page builds the Gantt's step list (gantt_columnar.run_info) in the
    background instead. Before the conversion (a running run) the lines are loaded."""
    from backend.services import run_traces
    run = dp_tp_run(tmp_path / "run", steps=3)
    assert run_traces.get(run) is not None  # not converted yet: the loaded traces
    convert.convert_run_dir(run)
    assert list(run.glob("trace-rank*.jsonl")) and run_traces.get(run) is None
    gantt_columnar._CACHE.clear()
    run_traces.warm(run)
    assert [i["steps"] for i in gantt_columnar._CACHE.values()] == [
        gantt.columns(load_run_dir(run)).steps]


def test_a_pipeline_steps_schedule_is_simulated_over_the_runs_steady_steps(pp_run, tmp_path):
    """The schedule drawn under a pipeline step is the analysis' simulation (the headline's
    bubble_simulated_fraction): over the run's steady steps' stage times, not only over the
    window's records. The oracle: the whole loaded traces' Gantt."""
    import shutil
    run = tmp_path / "pp"
    shutil.copytree(pp_run, run, ignore=shutil.ignore_patterns("*.parquet", "table-*",
                                                               "analysis.json"))
    convert.convert_run_dir(run)
    full = gantt.columns(load_run_dir(run))
    steps = [s["step"] for s in full.steps]
    assert len(steps) >= 3
    for step in steps[1:]:
        want = gantt.gantt(full, step=step)["theory"]
        got = gantt_columnar.answer(run, step=step, t0_ms=None, t1_ms=None, max_spans=20000,
                                    px=2000)["theory"]
        assert got["bubble_fraction"] == pytest.approx(want["bubble_fraction"], rel=1e-9)
        assert got["makespan_ms"] == pytest.approx(want["makespan_ms"], rel=1e-9)
