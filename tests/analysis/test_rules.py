"""The figures the run page shows, each under one rule (jobs/analysis/rules.py), on traces
with known answers: the straggler is the rank that arrived last (and none below the
threshold), the pipeline bubble partitions the step, aggregates skip the warm-up step, and the
one CSV writer neutralises spreadsheet formulas."""

import csv
import io

import pytest

from devtools.oracle import analyze
from jobs.analysis import from_records, rows_to_csv
from jobs.analysis.rules import STRAGGLER_MIN_WAIT_FRACTION, steady, steady_range
from tests.analysis.synth import comm, end, meta, span

approx = pytest.approx
DDP = {"preset": "ddp", "train": {"steps": 4}}
PP = {"preset": "pp-1f1b", "train": {"steps": 2}}


def ddp_steps(arrive: dict[int, list[float]], steps: int = 4):
    """Two ranks, one all-reduce per 100 µs step; rank r issues it at arrive[r][step] and both
    complete at the later arrival + 5 µs (the others wait in the collective)."""
    recs = {r: [meta(r, 2, spec=DDP)] for r in range(2)}
    for s in range(steps):
        base = 100.0 * s
        last = max(arrive[r][s] for r in range(2))
        for r in range(2):
            a = arrive[r][s]
            recs[r] += [span(r, s, "step", base, base + 100, cat="step"),
                        span(r, s, "forward", base, base + a - 1),
                        comm(r, s, "all_reduce", base + a, base + last + 5, n=2, payload=4096,
                             seq=s)]
    for r in range(2):
        recs[r].append(end(r, 100.0 * steps + 1))
    return analyze(from_records(recs))


def test_the_straggler_is_the_rank_that_arrived_last():
    # the DDP case: rank 1 sits in the all-reduce from 5 µs, rank 0 arrives at 37 µs
    a = ddp_steps({0: [37, 37, 37, 37], 1: [5, 5, 5, 5]})
    rows = a["tables"]["stragglers"]
    assert [(r["step"], r["rank"], r["flagged"]) for r in rows] == [
        (s, 0, True) for s in range(4)]
    assert rows[1]["caused_wait_s"] == approx(32e-6) and rows[1]["wait_fraction"] == approx(0.32)
    h = a["headline"]
    assert h["straggler_rank"] == 0 and h["straggler_flagged_steps"] == 3  # steps 1-3
    assert h["straggler_wait_s"] == approx(32e-6)
    coll = a["tables"]["collectives"]
    assert {(r["last_rank"], round(r["wait_s"] * 1e6)) for r in coll} == {(0, 32)}


def test_no_straggler_below_the_threshold():
    gap = STRAGGLER_MIN_WAIT_FRACTION * 100 * 0.8  # µs: under the threshold of a 100 µs step
    a = ddp_steps({0: [30 + gap] * 4, 1: [30] * 4})
    assert all(not r["flagged"] for r in a["tables"]["stragglers"])
    assert a["headline"]["straggler_rank"] is None


def test_a_rank_late_in_only_some_steps_is_not_the_run_straggler():
    a = ddp_steps({0: [40, 40, 10, 10], 1: [10, 10, 40, 40]})
    flagged = [(r["step"], r["rank"]) for r in a["tables"]["stragglers"] if r["flagged"]]
    assert flagged == [(0, 0), (1, 0), (2, 1), (3, 1)]
    # steady steps 1-3: rank 1 in 2 of 3 (>= half) -> rank 1
    assert a["headline"]["straggler_rank"] == 1
    a = ddp_steps({0: [40, 40, 10, 10, 10, 40], 1: [10, 10, 40, 40, 40, 10]}, steps=6)
    assert a["headline"]["straggler_rank"] == 1  # 3 of 5 steady steps
    a = ddp_steps({0: [40, 40, 10, 20, 20], 1: [10, 10, 40, 20, 20]}, steps=5)
    assert a["headline"]["straggler_rank"] is None  # 1 of 4 steady steps each: no one


def test_steady_rule():
    assert steady([0, 1, 2, 3]) == [1, 2, 3] and steady([0]) == [0] and steady([]) == []
    assert steady_range([3, 0, 1]) == [1, 3] and steady_range([]) is None


def pipeline(optimizer_overlap: bool):
    """p = 2, m = 1, two steps, with step spans: rank 0 F [0,10], rank 1 F [12,22] and BW
    [22,42], rank 0 BW [44,64]; the step-1 copy is shifted by 100. With `optimizer_overlap`,
    rank 1's step-0 optimizer runs [100,112] (its step 0 ends, step 1 starts, at 112): inside
    step 1's pipeline window, where rank 1 is busy, not in a bubble."""
    recs = {r: [meta(r, 2, {"pp": r, "dp": 0, "tp": 0}, spec=PP)] for r in range(2)}
    for s in range(2):
        b = 100.0 * s
        acts = {0: [("F", 0, 10), ("BW", 44, 64)], 1: [("F", 12, 22), ("BW", 22, 42)]}
        for r in range(2):
            for k, t0, t1 in acts[r]:
                recs[r].append(span(r, s, k, b + t0, b + t1, mb=0, action=k, chunk=0, stage=r))
            recs[r].append(comm(r, s, "recv" if r else "send", b + 10, b + 12, n=2, payload=64,
                                axis="pp", group="pp:p2p:0-1", peer=1 - r, seq=s))
        recs[0].append(span(0, s, "step", b, b + 70, cat="step"))
        if optimizer_overlap:
            recs[1].append(span(1, s, "step", 112 if s else 0.5, b + 70 if s else 112,
                                cat="step"))
        else:
            recs[1].append(span(1, s, "step", b + 0.5, b + 70 if s else b + 99.5, cat="step"))
    if optimizer_overlap:
        recs[1].append(span(1, 0, "optimizer", 100, 112))
    return analyze(from_records(recs))


def test_pipeline_bubble_partitions_the_step_and_p2p_waits_are_bubble():
    a = pipeline(False)
    rows = {(r["step"], r["rank"]): r for r in a["tables"]["step_rank"]}
    r1 = rows[(1, 1)]
    # window [100,164]; rank 1 computes [112,142]: idle 34 of 64; its step span [100.5,170]
    assert r1["pipeline_window_s"] == approx(64e-6) and r1["pipeline_idle_s"] == approx(34e-6)
    assert r1["bubble_s"] == approx(33.5e-6)  # the part inside its own step
    assert r1["exposed_comm_s"] == approx(0.0)  # the recv wait [110,112] is bubble
    for r in rows.values():
        total = r["compute_s"] + r["exposed_comm_s"] + r["bubble_s"] + r["idle_s"]
        assert total == approx(r["step_s"], rel=1e-12)
    st = {r["stage"]: r for r in a["tables"]["stage_bubbles"]}
    assert st[1]["measured_idle_fraction"] == approx(34 / 64)
    assert st[0]["measured_idle_fraction"] == approx(34 / 64)
    assert a["headline"]["bubble_fraction"] == approx(34 / 64)
    assert a["headline"]["steady_steps"] == [1, 1]


def test_previous_optimizer_inside_the_window_is_busy_not_bubble():
    a = pipeline(True)
    r1 = next(r for r in a["tables"]["step_rank"] if (r["step"], r["rank"]) == (1, 1))
    # window [100,164]: rank 1 busy [100,112] (step 0's optimizer) + [112,142]: idle [142,164]
    assert r1["pipeline_idle_s"] == approx(22e-6) and r1["bubble_s"] == approx(22e-6)


def test_csv_neutralises_formulas_and_keeps_numbers():
    text = rows_to_csv([{"name": "=cmd|x", "a": "+1", "b": "-2", "c": "@x", "d": "\tx",
                         "n": -1.5, "m": None, "o": {"k": [1]}}])
    header, row = list(csv.reader(io.StringIO(text)))
    assert header == ["name", "a", "b", "c", "d", "n", "m", "o"]
    assert row == ["'=cmd|x", "'+1", "'-2", "'@x", "'\tx", "-1.5", "", '{"k":[1]}']
