"""The per-link table (issue #16 part 4): each comm record's link from its group's hosts."""

from types import SimpleNamespace

import pytest

from devtools.oracle import analyze
from devtools.oracle.collectives import axis_bytes_table, collectives_table
from devtools.oracle.links import links_table
from jobs.analysis import from_records
from jobs.analysis.links import rank_hosts
from jobs.spec import parse_spec
from jobs.theory import predict
from tests.analysis.synth import comm, meta, span

approx = pytest.approx
S = 1_000_000
SPEC = {"preset": "tp", "parallel": {"dp": 2, "tp": 2}, "runtime": {"nproc_per_node": 4}}


def coords(r):  # jobs.dims order, tp innermost: tp groups {0,1} {2,3}, dp groups {0,2} {1,3}
    return {"pp": 0, "dp": r // 2, "tp": r % 2}


def dp_tp_run(node_rank=None, steps=3):
    """Per step: a tp all-reduce (20 µs transfer) then a dp all-reduce (100 µs transfer)."""
    recs = {}
    for r in range(4):
        m = meta(r, 4, coords(r))
        if node_rank is not None:
            m["node_rank"] = node_rank(r)
        out = [m]
        for st in range(steps):
            t = 1000 * st
            out += [span(r, st, "step", t, t + 900, cat="step"),
                    comm(r, st, "all_reduce", t + 10, t + 30, n=2, payload=S, group="tp",
                         axis="tp", seq=st),
                    comm(r, st, "all_reduce", t + 100, t + 200, n=2, payload=2 * S,
                         group="dp", axis="dp", seq=st)]
        recs[r] = out
    return from_records(recs)


def test_one_host_gives_one_intra_row_per_axis_from_the_spec():
    tr, sp = dp_tp_run(), parse_spec(SPEC)
    hosts, source = rank_hosts(tr, sp)
    assert set(hosts.values()) == {0} and "nproc_per_node = 4" in source
    rows = links_table(tr, sp, collectives_table(tr), None)
    assert [(r["axis"], r["link"]) for r in rows] == [("dp", "intra"), ("tp", "intra")]
    axis = {r["axis"]: max(x["bytes_sent_per_step"] for x in axis_bytes_table(tr)
                           if x["axis"] == r["axis"]) for r in rows}
    for r in rows:  # the same bytes per step as the per-axis table, all on the one link
        assert r["bytes_sent_per_step"] == axis[r["axis"]] and r["ranks"] == 4


def test_hosts_from_trace_meta_split_the_axes_over_the_two_links():
    # ranks 0, 1 on node 0 and 2, 3 on node 1: tp groups stay inside, dp groups cross
    tr, sp = dp_tp_run(node_rank=lambda r: r // 2), parse_spec(SPEC)
    assert rank_hosts(tr, sp)[1] == "trace meta `node_rank`"
    rows = {(r["axis"], r["link"]): r for r in links_table(tr, sp, collectives_table(tr), None)}
    assert set(rows) == {("tp", "intra"), ("dp", "inter")}
    dp, tp = rows[("dp", "inter")], rows[("tp", "intra")]
    assert dp["bytes_sent_per_step"] == approx(2 * S) and tp["bytes_sent_per_step"] == approx(S)
    # busbw of each link from its own instances: all-reduce n = 2, factor 1, steady steps 1-2
    assert dp["busbw_GBps"] == approx(2 * S / 100e-6 / 1e9) and dp["instances"] == 4
    assert tp["busbw_GBps"] == approx(S / 20e-6 / 1e9) and tp["instances"] == 4
    assert dp["hosts"] == 2


def test_spec_placement_is_used_without_meta_hosts():
    # ranks 0, 1 | 2, 3 per host through rank // nproc_per_node (a JobSpec may not say
    # nnodes > 1 yet, so the two-host spec is a stand-in with the fields the table reads)
    tr = dp_tp_run()
    sp = SimpleNamespace(kind="train", runtime=SimpleNamespace(nnodes=2, nproc_per_node=2),
                         parallel=SimpleNamespace(dp=2, tp=2, pp=1))
    rows = links_table(tr, sp, collectives_table(tr), None)
    assert {(r["axis"], r["link"]) for r in rows} == {("tp", "intra"), ("dp", "inter")}


def test_pipeline_hop_link_from_its_two_ends():
    # pp = 4 on two hosts of 2: the hop 1 -> 2 crosses, 0 -> 1 and 2 -> 3 do not
    recs = {r: [{**meta(r, 4, {"pp": r, "dp": 0, "tp": 0}), "node_rank": r // 2}]
            for r in range(4)}
    for r in range(3):
        recs[r].append(comm(r, 0, "send", 10, 11, n=2, payload=512, group=f"pp:send:{r + 1}",
                            axis="pp", peer=r + 1))
        recs[r + 1].append(comm(r + 1, 0, "recv", 0, 20, n=2, payload=512,
                                group=f"pp:recv:{r}", axis="pp", peer=r))
    tr = from_records(recs)
    rows = {r["link"]: r for r in links_table(tr, None, collectives_table(tr), None)}
    assert rows["inter"]["ranks"] == 2 and rows["intra"]["ranks"] == 4  # ends 1, 2 | all
    assert rows["inter"]["bytes_sent_per_step"] == rows["intra"]["bytes_sent_per_step"] == 512
    assert rows["inter"]["instances"] == 1 and rows["intra"]["instances"] == 2


def test_analysis_has_the_links_table_with_the_prediction_next_to_it():
    tr, sp = dp_tp_run(), parse_spec(SPEC)
    rows = analyze(tr, sp)["tables"]["links"]
    theory = {x["axis"]: x for x in predict(sp)["comm"]["links"]["per_axis"]}
    assert [(r["axis"], r["link"]) for r in rows] == [("dp", "intra"), ("tp", "intra")]
    for r in rows:
        t = theory[r["axis"]]
        assert (r["predicted_link"], r["predicted_bytes"], r["predicted_time_s"]) == \
            (t["link"], t["bytes_per_rank"], t["time_s"]) == ("intra", t["bytes_per_rank"],
                                                              t["time_s"])
        assert r["predicted_bytes"] > 0
        assert r["predicted_bandwidth_source"].startswith("default")  # a run gives no bandwidth
