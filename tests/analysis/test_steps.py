"""Per step and rank: compute, comm, overlap, exposed comm, idle on traces with known answers."""

import pytest

from devtools.oracle.steps import step_rank_table, throughput_table
from jobs.analysis import from_records
from jobs.analysis import intervals as iv
from tests.analysis.synth import comm, end, meta, span

approx = pytest.approx


def one_rank(*recs):
    return from_records({0: [meta(0, 1), *recs, end(0, 1000)]})


def row(tr, step=0, rank=0):
    return next(r for r in step_rank_table(tr) if r["step"] == step and r["rank"] == rank)


def test_interval_helpers():
    a = iv.union([(0, 10), (5, 20), (30, 40), (40, 45)])
    assert a == [(0, 20), (30, 45)]
    assert iv.length(a) == 35
    assert iv.intersect(a, [(15, 35)]) == [(15, 20), (30, 35)]
    assert iv.subtract(a, [(5, 8), (18, 32)]) == [(0, 5), (8, 18), (32, 45)]
    assert iv.clip(a, 10, 31) == [(10, 20), (30, 31)]


def test_async_bucket_overlaps_backward():
    # step [0,100]; forward [0,30], backward [30,70], bucket all-reduce in flight [50,90],
    # optimizer [90,95]: compute 75, comm 40, overlap 20, exposed 20, idle 5, overlap 50 %.
    tr = one_rank(span(0, 0, "step", 0, 100, cat="step"), span(0, 0, "forward", 0, 30),
                  span(0, 0, "backward", 30, 70),
                  comm(0, 0, "all_reduce", 50, 90, n=2, payload=1000, bucket=0),
                  span(0, 0, "optimizer", 90, 95))
    r = row(tr)
    assert r["step_s"] == approx(100e-6)
    assert r["compute_s"] == approx(75e-6)
    assert r["comm_s"] == approx(40e-6)
    assert r["overlap_s"] == approx(20e-6)
    assert r["exposed_comm_s"] == approx(20e-6)
    assert r["idle_s"] == approx(5e-6)
    assert r["overlap_pct"] == approx(50.0)


def test_synchronous_collective_inside_forward_is_not_overlap():
    # a blocking all-reduce [10,30] inside forward [0,50]: the host waited, it did not compute
    tr = one_rank(span(0, 0, "step", 0, 100, cat="step"), span(0, 0, "forward", 0, 50),
                  comm(0, 0, "all_reduce", 10, 30, n=2, payload=1000, group="tp", axis="tp"))
    r = row(tr)
    assert r["compute_s"] == approx(30e-6)
    assert r["comm_s"] == approx(20e-6)
    assert r["overlap_pct"] == approx(0.0)
    assert r["exposed_comm_s"] == approx(20e-6)
    assert r["idle_s"] == approx(50e-6)


def test_explicit_async_flag_wins():
    tr = one_rank(span(0, 0, "step", 0, 100, cat="step"), span(0, 0, "forward", 0, 50),
                  comm(0, 0, "all_gather", 10, 30, n=2, payload=1000, **{"async": True}))
    r = row(tr)
    assert r["compute_s"] == approx(50e-6)
    assert r["overlap_pct"] == approx(100.0)
    assert r["exposed_comm_s"] == approx(0.0)


def test_no_comm_means_no_overlap_pct_and_missing_step_span_is_warned():
    tr = one_rank(span(0, 0, "forward", 10, 40), span(0, 0, "backward", 50, 60))
    r = row(tr)
    assert r["overlap_pct"] is None
    assert r["step_s"] == approx(50e-6) and r["idle_s"] == approx(10e-6)
    assert any("without a `step` span" in w for w in tr.warnings)


def test_throughput_uses_slowest_rank_and_summary_loss():
    tr = from_records({
        0: [meta(0, 2), span(0, 0, "step", 0, 100, cat="step"),
            span(0, 1, "step", 100, 150, cat="step")],
        1: [meta(1, 2), span(1, 0, "step", 0, 120, cat="step"),
            span(1, 1, "step", 100, 140, cat="step")]})
    spec = {"kind": "train", "model": {"arch": "gpt", "seq_len": 16}, "train": {"global_batch": 8}}
    rows = throughput_table(step_rank_table(tr), spec, {"loss": [2.0, 1.5]})
    assert [r["step_s"] for r in rows] == approx([120e-6, 50e-6])
    assert rows[1]["tokens_per_s"] == approx(128 / 50e-6)
    assert [r["loss"] for r in rows] == [2.0, 1.5]
