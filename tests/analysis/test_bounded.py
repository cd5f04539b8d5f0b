"""Bounded tracing on real runs (gloo, CPU, one torchrun launch of three runs): only the
scheduled steps have detailed records, every step has its scalars (loss, step time), the
analysis has all steps in its per-step table, progress and comm totals still cover every step,
and the predicted records per traced step are the records written (jobs/trace_schedule.py)."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from devtools.oracle import analyze_run_dir
from jobs.spec import parse_spec
from jobs.trace_schedule import BYTES_PER_RECORD, predicted_trace, records_per_traced_step
from tests.support.launch import multirun, read_trace

SCHED = {"name": "sched", "model": {"layers": 2, "hidden": 16}, "parallel": {"dp": 2},
         "train": {"steps": 40, "grad_accum": 2, "global_batch": 4},
         "trace": {"wait": 4, "warmup": 2, "active": 2, "repeat": 3}}
TRACED = [6, 7, 14, 15, 22, 23]  # cycles of 8: steps 6-7 of each, three times
CAPPED = {"name": "capped", "model": {"layers": 2, "hidden": 16},
          "parallel": {"dp": 2, "dp_mode": "allreduce"},
          "train": {"steps": 8, "global_batch": 4}, "trace": {"level": "block",
                                                              "max_records": 30}}
STEP = {"name": "steplevel", "model": {"layers": 2, "hidden": 16}, "parallel": {"dp": 2},
        "train": {"steps": 4, "global_batch": 4}, "trace": {"level": "step", "steps": "1,3"}}
OFF = {"name": "off", "model": {"layers": 2, "hidden": 16}, "parallel": {"dp": 2},
       "train": {"steps": 5, "global_batch": 4}, "trace": {"level": "off"}}
DETAIL = ("span", "comm", "mem", "moe")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("bounded")
    multirun(2, [("sched", SCHED), ("capped", CAPPED), ("steplevel", STEP), ("off", OFF)], out,
             env={"PARALAB_DUMP_PARAMS": "0"}, timeout=240)
    return out


def by_step(recs, types=DETAIL):
    c: dict[int, Counter] = {}
    for r in recs:
        if r["type"] in types and r["step"] >= 0:
            c.setdefault(r["step"], Counter())[r["type"]] += 1
    return c


def test_only_scheduled_steps_have_detail_and_every_step_has_scalars(runs):
    d = runs / "sched"
    for rank in (0, 1):
        recs = read_trace(d, rank)
        assert sorted(by_step(recs)) == TRACED
        assert sorted({r["step"] for r in recs if r["type"] == "span"}) == TRACED
        sc = [r for r in recs if r["type"] == "scalars"]
        assert [r["step"] for r in sc] == list(range(40))
        assert [r["traced"] for r in sc] == [s in TRACED for s in range(40)]
        assert all(r["step_s"] > 0 and r["tokens"] == 4 and r["rss_bytes"] > 0 for r in sc)
        assert all(isinstance(r["loss"], float) and r["loss_weight"] == 0.5 for r in sc)
        spans = {r["step"]: r for r in recs if r["type"] == "span" and r["cat"] == "step"}
        for s in TRACED:  # the scalars' step time is the step span's
            assert sc[s]["step_s"] == spans[s]["dur_ns"] / 1e9
            assert sc[s]["loss"] == spans[s]["loss"]
        # the hang detector's progress advanced through the untraced last steps
        flight = json.loads((d / f"flight-rank{rank}.json").read_text())
        assert flight["steps_completed"] == 40
        assert sc[38]["ts_ns"] < flight["last_progress_ns"] <= sc[39]["ts_ns"]
    summary = json.loads((d / "summary.json").read_text())
    assert len(summary["loss"]) == len(summary["step_time_s"]) == 40
    for r in summary["formula_check"]["ranks"]:  # comm totals count untraced steps too
        assert len(r["bytes_sent_per_step"]) == 40
        assert r["bytes_sent_deviation"] == [0.0] * 40


def test_analysis_has_every_step_and_says_which_were_traced(runs):
    a = analyze_run_dir(runs / "sched")
    thr = a["tables"]["throughput"]
    assert [r["step"] for r in thr] == list(range(40))
    assert all(r["step_s"] > 0 and r["loss"] is not None for r in thr)
    assert [r["step"] for r in thr if r["traced"]] == TRACED
    assert {r["step"] for r in a["tables"]["step_rank"]} == set(TRACED)
    assert len(a["tables"]["step_rank"]) == 2 * len(TRACED)
    assert a["run"]["traced_steps"] == "6-7,14-15,22-23"
    assert a["run"]["trace"]["untraced_step_count"] == 34
    assert a["headline"]["steps"] == 40
    assert not a["warnings"], a["warnings"]
    # a live run has no summary yet: the losses come from the scalars of every step
    summary = json.loads((runs / "sched" / "summary.json").read_text())
    from devtools.oracle.steps import scalar_rows, step_rank_table, throughput_table
    from jobs.analysis.storage.load import load_run_dir
    tr = load_run_dir(runs / "sched")
    live = throughput_table(step_rank_table(tr), tr.spec_dict(), None, scalar_rows(tr))
    assert [r["loss"] for r in live] == pytest.approx(summary["loss"], rel=1e-9)


def test_predicted_records_per_traced_step_are_the_records_written(runs):
    """Exact rule: span and mem records per traced step and rank equal the prediction;
    collectives are not predicted at layer / block level (one all_reduce bucket here)."""
    sizes: dict[str, list[int]] = {}
    for name in ("sched", "steplevel"):
        spec = parse_spec({k: v for k, v in (SCHED if name == "sched" else STEP).items()})
        want = records_per_traced_step(spec)
        for rank in (0, 1):
            for step, c in by_step(read_trace(runs / name, rank)).items():
                assert c["span"] == want["span"] and c["mem"] == want["mem"], (name, step, c)
                if want["comm"] is not None:
                    assert c["comm"] == want["comm"]
        lines = (runs / name / "trace-rank0.jsonl").read_text().splitlines()
        for line in lines:
            sizes.setdefault(json.loads(line)["type"], []).append(len(line) + 1)
    assert sorted(by_step(read_trace(runs / "steplevel", 0))) == [1, 3]
    # whole files: exact at level step; at layer level short of exactly the collectives
    for name, spec in (("sched", SCHED), ("steplevel", STEP)):
        p = predicted_trace(parse_spec(spec))
        for rank in (0, 1):
            recs = read_trace(runs / name, rank)
            comms = sum(r["type"] == "comm" for r in recs)
            assert len(recs) - comms == p["records_per_rank"], (name, rank)
            assert comms == 0 or p["lower_bound"]
    print("mean bytes per record:", {k: round(sum(v) / len(v)) for k, v in sizes.items()},
          "assumed:", BYTES_PER_RECORD)


def test_max_records_stops_detail_at_a_step_boundary(runs):
    for rank in (0, 1):
        recs = read_trace(runs / "capped", rank)
        detailed = by_step(recs)
        before = sum(1 for r in recs if r["type"] in DETAIL and r["step"] < 0)
        counts, started = [], []
        for s in range(8):  # a step starts traced while fewer than 30 were written
            counts.append(before)
            started.append(before < 30)
            before += sum(detailed.get(s, Counter()).values())
        assert sorted(detailed) == [s for s in range(8) if started[s]]
        assert 0 < len(detailed) < 8
        capped = [r for r in recs if r["type"] == "instant" and r["name"] == "trace_capped"]
        assert len(capped) == 1 and capped[0]["step"] == len(detailed)
        assert capped[0]["records"] == counts[len(detailed)] >= 30
        assert not any(r["type"] == "span" and r["name"].endswith(".layer") for r in recs)
        assert len([r for r in recs if r["type"] == "scalars"]) == 8
    a = analyze_run_dir(runs / "capped")
    assert a["run"]["trace"]["capped_ranks"] == [0, 1]
    assert len(a["tables"]["throughput"]) == 8


def test_level_off_writes_scalars_only_and_the_analysis_keeps_every_step(runs):
    """`level: off`: no detailed record on any step (no init memory sample either), every
    step's scalars; the analysis' per-step table has the 5 losses and step times; predicted
    as 0 traced steps and 0 detailed records."""
    for rank in (0, 1):
        recs = read_trace(runs / "off", rank)
        assert {r["type"] for r in recs} <= {"meta", "scalars", "end", "instant"}
        assert [r["step"] for r in recs if r["type"] == "scalars"] == list(range(5))
    a = analyze_run_dir(runs / "off")
    thr = a["tables"]["throughput"]
    assert [r["step"] for r in thr] == list(range(5)) and not any(r["traced"] for r in thr)
    assert all(r["loss"] is not None and r["step_s"] > 0 for r in thr)
    assert a["tables"]["step_rank"] == [] and a["run"]["trace"]["traced_step_count"] == 0
    assert a["run"]["trace"]["schedule"].startswith("off: no detailed records")
    pred = predicted_trace(parse_spec(OFF))
    assert pred["traced_step_count"] == 0 and pred["records_per_traced_step"] == 0
    assert pred["records_per_rank"] == 5 + 2  # a scalars record per step, meta and end
