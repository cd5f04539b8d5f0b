"""Gantt level of detail over the Parquet files (jobs/analysis/lod.py): bounded boxes per lane,
every record of the window counted once, and the records themselves when the budget allows."""

from __future__ import annotations

import pytest

from jobs.analysis import columnar, lod
from tests.analysis import synth as s


def long_run(out, steps=200):
    per = {}
    for rank in range(2):
        recs = [s.meta(rank, 2)]
        for st in range(steps):
            t0 = 100 * st
            recs.append(s.span(rank, st, "forward", t0, t0 + 30))
            recs.append(s.span(rank, st, "grad_sync", t0 + 30, t0 + 60, cat="comm"))
            recs.append(s.comm(rank, st, "all_reduce", t0 + 35, t0 + 55 + rank, n=2,
                               payload=1024, seq=st))
            recs.append(s.span(rank, st, "step", t0, t0 + 90, cat="step"))
        recs.append(s.end(rank, 100 * steps))
        per[rank] = recs
    run = s.write(out, per)
    columnar.convert_run_dir(run)
    return run


def test_boxes_are_bounded_per_lane_and_count_every_record(tmp_path):
    run = long_run(tmp_path / "run")
    boxes = lod.gantt_boxes(run, max_boxes=16)
    lanes = {(b["rank"], b["lane"]) for b in boxes}
    assert lanes == {(r, ln) for r in range(2) for ln in ("compute", "sync", "comm dp")}
    for key in lanes:
        mine = [b for b in boxes if (b["rank"], b["lane"]) == key]
        assert 1 < len(mine) <= 16
        assert sum(b["n"] for b in mine) == 200  # one record per step and lane
    comm = [b for b in boxes if b["lane"] == "comm dp" and b["rank"] == 1]
    assert {b["name"] for b in comm} == {"all_reduce"}
    assert sum(b["bytes"] for b in comm) == 200 * 1024


def test_a_large_budget_gives_the_records_and_a_window_clips(tmp_path):
    run = long_run(tmp_path / "run", steps=5)
    boxes = lod.gantt_boxes(run, max_boxes=100000)
    fwd = [b for b in boxes if b["rank"] == 0 and b["lane"] == "compute"]
    assert [(b["t0_ns"], b["t1_ns"], b["n"]) for b in fwd] == [
        (100_000 * st, 100_000 * st + 30_000, 1) for st in range(5)]
    part = lod.gantt_boxes(run, t0_ns=110_000, t1_ns=210_000, max_boxes=4)
    fwd = [b for b in part if b["rank"] == 0 and b["lane"] == "compute"]
    assert [(b["t0_ns"], b["t1_ns"]) for b in fwd] == [(110_000, 130_000), (200_000, 210_000)]
    with pytest.raises(ValueError, match="max_boxes"):
        lod.gantt_boxes(run, max_boxes=0)
