"""Per collective: algbw / busbw with nccl-tests factors, wait vs transfer, stragglers,
cross-rank matching (several groups share a name; point-to-point pairs), bytes per axis."""

import pytest

from devtools.oracle.collectives import axis_bytes_table, collectives_table
from devtools.oracle.steps import step_rank_table
from devtools.oracle.stragglers import stragglers_table
from jobs.analysis import from_records
from tests.analysis.synth import comm, meta, span

approx = pytest.approx
S = 1_000_000


def four_ranks(op, arrive, finish, payload=S, step=0, seq=0, **kw):
    return {r: [comm(r, step, op, arrive[r], finish[r], n=4, payload=payload, seq=seq, **kw)]
            for r in range(4)}


def merge(*parts):
    out = {r: [meta(r, 4)] for r in range(4)}
    for p in parts:
        for r, recs in p.items():
            out[r] += recs
    return from_records(out)


@pytest.mark.parametrize("op,factor", [("all_reduce", 1.5), ("reduce_scatter", 0.75),
                                       ("all_gather", 0.75), ("all_to_all", 0.75),
                                       ("broadcast", 1.0)])
def test_busbw_and_wait_vs_transfer(op, factor):
    # ranks arrive at 0, 10, 20, 30 µs; the last (rank 3) finishes at 80 µs: transfer 50 µs on
    # the last-arriving rank, the first rank waited 30 µs for it.
    kw = {"is_root": True} if op == "broadcast" else {}
    tr = merge(four_ranks(op, [0, 10, 20, 30], [80, 80, 80, 80], **kw))
    (row,) = collectives_table(tr)
    assert row["op"] == op and row["group_size"] == 4 and row["complete"]
    assert row["last_rank"] == 3
    assert row["wait_s"] == approx(30e-6)
    assert row["duration_s"] == approx(50e-6)
    assert row["algbw_GBps"] == approx(S / 50e-6 / 1e9)          # 20 GB/s
    assert row["busbw_GBps"] == approx(S / 50e-6 / 1e9 * factor)


def test_bytes_sent_uses_commbytes():
    tr = merge(four_ranks("all_reduce", [0] * 4, [10] * 4))
    assert collectives_table(tr)[0]["bytes_sent"] == approx(2 * 3 / 4 * S)


def test_straggler_is_the_rank_others_waited_for_longest():
    tr = merge(four_ranks("all_reduce", [0, 0, 10, 0], [50] * 4, seq=0),      # rank 2: 10 µs
               four_ranks("all_reduce", [60, 60, 60, 90], [99] * 4, seq=1),   # rank 3: 30 µs
               four_ranks("all_reduce", [100, 105, 100, 100], [120] * 4, step=1, seq=2),
               four_ranks("all_reduce", [130, 135, 130, 130], [140] * 4, step=1, seq=3),
               four_ranks("all_reduce", [150, 150, 150, 158], [160] * 4, step=1, seq=4))
    rows = stragglers_table(collectives_table(tr), step_rank_table(tr))
    by_step = {r["step"]: r for r in rows}
    assert by_step[0]["rank"] == 3 and by_step[0]["caused_wait_s"] == approx(30e-6)
    assert by_step[1]["rank"] == 1 and by_step[1]["times_last"] == 2
    assert by_step[1]["caused_wait_s"] == approx(10e-6)


def test_groups_with_the_same_name_are_told_apart_by_coordinates():
    # 4 ranks, tp = rank % 2, dp = rank // 2: two TP groups {0,1}, {2,3}, both named "tp"
    recs = {r: [meta(r, 4, {"pp": 0, "dp": r // 2, "tp": r % 2}),
                comm(r, 0, "all_reduce", r, 50, n=2, payload=S, group="tp", axis="tp")]
            for r in range(4)}
    rows = collectives_table(from_records(recs))
    assert sorted(tuple(r["ranks"]) for r in rows) == [(0, 1), (2, 3)]
    assert all(r["complete"] for r in rows)
    assert {r["last_rank"] for r in rows} == {1, 3}


def test_send_recv_pairs_match_across_asymmetric_group_names():
    # pipeline p2p: rank 0 isend at 10 µs (returns at 11), rank 1 recv posted at 0, done at 20
    recs = {0: [meta(0, 2, {"pp": 0, "dp": 0, "tp": 0}),
                comm(0, 0, "send", 10, 11, n=2, payload=512, group="pp:send:1", axis="pp",
                     peer=1)],
            1: [meta(1, 2, {"pp": 1, "dp": 0, "tp": 0}),
                comm(1, 0, "recv", 0, 20, n=2, payload=512, group="pp:recv:0", axis="pp",
                     peer=0)]}
    (row,) = collectives_table(from_records(recs))
    assert row["op"] == "send_recv" and row["ranks"] == [0, 1] and row["complete"]
    assert row["last_rank"] == 0
    assert row["wait_s"] == approx(10e-6)
    assert row["duration_s"] == approx(10e-6)
    assert row["busbw_GBps"] == approx(row["algbw_GBps"])


def test_incomplete_instance_is_reported_not_raised():
    tr = merge({0: [comm(0, 0, "all_reduce", 0, 10, n=4, payload=S)],
                1: [comm(1, 0, "all_reduce", 2, 10, n=4, payload=S)]})
    (row,) = collectives_table(tr)
    assert not row["complete"] and row["ranks"] == [0, 1]
    assert any("fewer ranks" in w for w in tr.warnings)


def test_bytes_per_axis_separate_setup_and_steps():
    recs = {0: [meta(0, 2, {"pp": 0, "dp": 0, "tp": 0}),
                comm(0, -1, "broadcast", 0, 1, n=2, payload=100, is_root=True, seq=0),
                span(0, 0, "step", 1, 50, cat="step"), span(0, 1, "step", 50, 99, cat="step"),
                comm(0, 0, "all_reduce", 2, 9, n=2, payload=S, seq=1),
                comm(0, 1, "all_reduce", 52, 59, n=2, payload=S, seq=2),
                comm(0, 1, "all_reduce", 60, 62, n=2, payload=4000, group="tp", axis="tp")]}
    rows = {r["axis"]: r for r in axis_bytes_table(from_records(recs))}
    assert rows["dp"]["setup_bytes_sent"] == 100
    assert rows["dp"]["bytes_sent"] == 2 * S and rows["dp"]["steps"] == 2
    assert rows["dp"]["bytes_sent_per_step"] == S
    assert rows["tp"]["bytes_sent"] == 4000 and rows["tp"]["bytes_sent_per_step"] == 2000
