"""Hand-computed figures on a small synthetic 2-rank trace (issue 43, "caught only
indirectly"): the headline overlap is the ratio of sums (Σ overlapped / Σ comm over the steady
steps and every rank, jobs/analysis/rules.py "overlap"), not a mean of per-rank percentages;
and each rank's received bytes are its own `bytes_recv`, not what it sent. Checked on both
the Python path and the columnar (scale) path, each against the numbers below, never against
the other."""

from __future__ import annotations

import pytest

from devtools.oracle import analyze_run_dir
from jobs.analysis import engine
from jobs.analysis.storage import convert
from tests.analysis import synth as s

SPEC = {"preset": "ddp", "parallel": {"dp": 2}, "model": {"arch": "mlp"},
        "runtime": {"nproc_per_node": 2}, "train": {"steps": 3}}
STEPS = 3
# Per step, times in µs from the step's start (the same every step):
#            compute    all_reduce (dp)   all_to_all (ep)   step span
#   rank 0   [0, 50]    [40, 60]          [70, 80]          [0, 160]
#   rank 1   [0, 50]    [20, 100]         [100, 150]        [0, 160]
# comm: rank 0 20 + 10 = 30, overlapped 10 (33.3 %); rank 1 80 + 50 = 130, overlapped 30
# (23.1 %). Ratio of sums: (10 + 30) / (30 + 130) = 25 %; a mean of the percentages would
# say 28.2 %.
LAYOUT = {0: {"ar": (40, 60), "a2a": (70, 80)}, 1: {"ar": (20, 100), "a2a": (100, 150)}}
OVERLAP_PCT = 100.0 * (10 + 30) / (30 + 130)
# Bytes per step (uneven all-to-all: rank 0 sends 3000 B and gets 1000 B, rank 1 the other
# way round); the all-reduce moves 8192 B each way on both ranks.
A2A = {0: (3000.0, 1000.0), 1: (1000.0, 3000.0)}  # (bytes_sent, bytes_recv)
AR = 8192.0


def trace(out):
    per = {}
    for rank in (0, 1):
        recs = [s.meta(rank, 2, {"pp": 0, "dp": rank, "tp": 0}, SPEC if rank == 0 else None)]
        for st in range(STEPS):
            t0 = 1000 * st
            lay = LAYOUT[rank]
            recs.append(s.span(rank, st, "forward", t0, t0 + 50, mb=0))
            a, b = lay["ar"]
            recs.append(s.comm(rank, st, "all_reduce", t0 + a, t0 + b, n=2, payload=8192,
                               seq=st, bytes_sent=AR, bytes_recv=AR))
            a, b = lay["a2a"]
            sent, recv = A2A[rank]
            recs.append(s.comm(rank, st, "all_to_all", t0 + a, t0 + b, n=2, payload=4000,
                               group="ep", axis="ep", seq=st, bytes_sent=sent,
                               bytes_recv=recv))
            recs.append(s.span(rank, st, "step", t0, t0 + 160, cat="step", loss=1.0))
        recs.append(s.end(rank, 1000 * STEPS))
        per[rank] = recs
    return s.write(out, per, {"loss": [1.0] * STEPS})


def analyses(tmp_path) -> dict:
    py = analyze_run_dir(trace(tmp_path / "py"))
    col_dir = trace(tmp_path / "col")
    convert.convert_run_dir(col_dir)
    col = engine.analyze_columnar(col_dir)
    assert py["engine"] == "python" and col["engine"] == "columnar"
    return {"python": py, "columnar": col}


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    return analyses(tmp_path_factory.mktemp("hand"))


@pytest.mark.parametrize("engine", ["python", "columnar"])
def test_overlap_is_total_overlapped_over_total_comm(both, engine):
    a = both[engine]
    assert a["headline"]["overlap_pct"] == pytest.approx(OVERLAP_PCT, rel=1e-9)
    rows = {(r["step"], r["rank"]): r for r in a["tables"]["step_rank"]}
    for st in range(STEPS):  # the per-rank rows the ratio is made of
        assert rows[(st, 0)]["comm_s"] == pytest.approx(30e-6)
        assert rows[(st, 0)]["overlap_s"] == pytest.approx(10e-6)
        assert rows[(st, 1)]["comm_s"] == pytest.approx(130e-6)
        assert rows[(st, 1)]["overlap_s"] == pytest.approx(30e-6)


@pytest.mark.parametrize("engine", ["python", "columnar"])
def test_received_bytes_are_each_ranks_own(both, engine):
    rows = {(r["rank"], r["axis"]): r for r in both[engine]["tables"]["axis_bytes"]}
    assert set(rows) == {(0, "dp"), (1, "dp"), (0, "ep"), (1, "ep")}
    for rank in (0, 1):
        sent, recv = A2A[rank]
        ep, dp = rows[(rank, "ep")], rows[(rank, "dp")]
        assert (ep["bytes_sent"], ep["bytes_recv"]) == (STEPS * sent, STEPS * recv), rank
        assert (ep["bytes_sent_per_step"], ep["bytes_recv_per_step"]) == (sent, recv), rank
        assert (dp["bytes_sent"], dp["bytes_recv"]) == (STEPS * AR, STEPS * AR), rank
        assert ep["steps"] == dp["steps"] == STEPS
    # the busiest sender: rank 0, 8192 + 3000 B a step
    assert both[engine]["headline"]["comm_bytes_per_rank"] == AR + 3000.0
