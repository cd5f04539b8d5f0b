"""A step that not every rank finished is not a step (issue 37, item 5): a cancelled or live
run's last step, timed as the extent of its records so far, once plotted as a real step (a 6x
tokens/s spike) and wrote the same row to throughput.csv. Both engines leave it out of the
throughput table, the step time and tokens/s, and say so in the warnings."""

from __future__ import annotations

import csv
import io

from devtools.oracle import analyze_run_dir
from jobs.analysis import engine, tables_to_csv
from jobs.analysis.storage import convert
from tests.analysis.synth import comm, end, meta, span, write
from tests.analysis.test_columnar import dp_tp_run

DDP = {"preset": "ddp", "parallel": {"dp": 2}, "runtime": {"nproc_per_node": 2},
       "train": {"global_batch": 8}}


def cancelled_run(out, last_on_rank1: bool):
    """2 ranks, steps 0-3 whole (100 µs each), step 4 cut short at its forward (rank 0); rank 1
    either finished step 4 (`last_on_rank1`: a live run, rank 0 behind) or is mid-way too."""
    per = {}
    for rank in range(2):
        recs = [meta(rank, 2, spec=DDP)]
        for st in range(4):
            t = 100 * st
            recs += [span(rank, st, "forward", t, t + 40),
                     comm(rank, st, "all_reduce", t + 40, t + 90, n=2, payload=4000, seq=st,
                          bucket=0),
                     span(rank, st, "step", t, t + 100, cat="step", loss=2.0 - st / 10,
                          loss_weight=0.5)]
        recs.append(span(rank, 4, "forward", 400, 415))  # a sixth of a step so far
        if rank == 1 and last_on_rank1:
            recs.append(span(rank, 4, "step", 400, 500, cat="step", loss=1.5, loss_weight=0.5))
        if rank == 1:
            recs.append(end(rank, 520))
        per[rank] = recs  # rank 0 was cancelled: no end record
    return write(out, per)


def test_the_unfinished_last_step_is_not_in_throughput_nor_its_csv(tmp_path):
    for i, live in enumerate((False, True)):
        a = analyze_run_dir(cancelled_run(tmp_path / f"run{i}", live))
        rows = a["tables"]["throughput"]
        assert [r["step"] for r in rows] == [0, 1, 2, 3], live
        assert {r["tokens_per_s"] for r in rows} == {8 / 100e-6}  # no spike
        text = tables_to_csv(a["tables"], "throughput")
        assert [r["step"] for r in csv.DictReader(io.StringIO(text))] == ["0", "1", "2", "3"]
        h = a["headline"]
        assert h["step_time_s"] == 100e-6 and h["steady_steps"] == [1, 3]
        assert h["tokens_per_s"] == 8 / 100e-6
        assert any("step(s) 4 not finished by every rank" in w for w in a["warnings"])
        # the per-rank rows keep what was traced (the Gantt and the diagnosis read them)
        assert any(r["step"] == 4 for r in a["tables"]["step_rank"])


def test_the_columnar_engine_leaves_it_out_too(tmp_path):
    run = dp_tp_run(tmp_path / "run", steps=4, unfinished=(2, 3))  # rank 2 never ended step 3
    convert.convert_run_dir(run)
    got = engine.analyze_columnar(run)
    want = analyze_run_dir(run)
    assert got["engine"] == "columnar"
    for a in (got, want):
        assert [r["step"] for r in a["tables"]["throughput"]] == [0, 1, 2]
        assert any("step(s) 3 not finished" in w for w in a["warnings"])
