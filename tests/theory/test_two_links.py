"""Two links (issue #16 part 4): which mesh axes cross hosts, the bytes and time on each link."""

import itertools

import pytest

from jobs import commbytes
from jobs.dims import ParallelDims
from jobs.spec import SpecError, parse_spec
from jobs.theory import predict
from jobs.theory.links import (
    DEFAULT_INTER_GBPS,
    DEFAULT_INTRA_GBPS,
    axis_crossing,
    brute_axis_crossing,
)

GPT = {"params": 1e9, "zero_stage": 0, "memory_model": "16psi", "layers": 4, "hidden": 1024,
       "heads": 16, "seq_len": 512, "micro_batch_size": 2}


def links_of(out: dict) -> dict:
    return {r["axis"]: r for r in out["comm"]["links"]["per_axis"]}


@pytest.mark.parametrize("dp,tp,pp,npn,expect", [
    (2, 4, 1, 4, {"tp": "intra", "dp": "inter"}),         # 2 hosts x 4: TP inside, DP across
    (1, 4, 2, 4, {"tp": "intra", "pp": "inter"}),         # pp=2 x tp=4: stages on two hosts
    (8, 1, 1, 4, {"dp": "inter"}),                        # dp=8 over 2 hosts
    (2, 4, 1, 2, {"tp": "inter", "dp": "inter"}),         # tp=4 > 2 GPUs per host
    (4, 2, 1, 4, {"tp": "intra", "dp": "inter"}),         # dp 4 = 2 per host x 2 hosts
    (2, 2, 2, 4, {"tp": "intra", "dp": "intra", "pp": "inter"}),  # a tp x dp block per host
])
def test_axis_link_attribution(dp, tp, pp, npn, expect):
    got = axis_crossing(dp, tp, pp, npn)
    assert {a: got[a]["link"] for a in expect} == expect
    for a, link in expect.items():  # every group crosses or none does, in these layouts
        g = got[a]
        assert g["groups_crossing"] == (g["groups"] if link == "inter" else 0), (a, g)


def test_some_groups_of_an_axis_cross_and_the_axis_is_inter():
    # tp=2, dp=3 on 2 hosts of 3: tp groups {0,1} {2,3} {4,5}; {2,3} spans hosts 0 and 1
    got = axis_crossing(3, 2, 1, 3)
    assert got["tp"] == {"group_size": 2, "groups": 3, "groups_crossing": 1, "link": "inter"}


def test_closed_form_counts_equal_listing_every_group():
    """The periodic count against jobs.dims' own groups, for every small layout and host size."""
    for dp, tp, pp in itertools.product(range(1, 7), range(1, 7), range(1, 5)):
        world = dp * tp * pp
        for npn in (c for c in range(1, world + 1) if world % c == 0):
            got = {a: v["groups_crossing"] for a, v in axis_crossing(dp, tp, pp, npn).items()}
            assert got == brute_axis_crossing(ParallelDims(dp, tp, pp, world), npn), \
                (dp, tp, pp, npn)


def test_one_host_nothing_crosses_even_for_huge_layouts():
    got = axis_crossing(10**6, 8, 4, 32 * 10**6, nnodes=1)
    assert {a: v["groups_crossing"] for a, v in got.items()} == {"tp": 0, "dp": 0, "pp": 0}


def test_time_per_link_uses_each_axis_own_link():
    out = predict({**GPT, "dp": 2, "tp": 4, "pp": 1, "nnodes": 2,
                   "intra_bandwidth_GBps": 100.0, "inter_bandwidth_GBps": 10.0})
    ln, comp = links_of(out), out["comm"]["components"]
    assert out["inputs"]["nproc_per_node"] == 4
    assert ln["tp"]["link"] == "intra" and ln["dp"]["link"] == "inter"
    assert ln["tp"]["busbw_GBps"] == 100.0 and ln["dp"]["busbw_GBps"] == 10.0
    # the DP bytes are the ring all-reduce of the rank's gradient shard (commbytes factors)
    psi = 1e9 / 4
    assert ln["dp"]["bytes_per_rank"] == comp["dp"] == pytest.approx(
        commbytes.bytes_sent("all_reduce", psi * 2, 2))
    assert ln["dp"]["time_s"] == pytest.approx(comp["dp"] / 10e9)
    assert ln["tp"]["time_s"] == pytest.approx(comp["tp"] / 100e9) and comp["tp"] > 0
    per = out["comm"]["links"]["per_link"]
    assert per["inter"]["axes"] == ["dp"] and per["intra"]["axes"] == ["tp", "pp"]
    assert per["inter"]["time_s"] == pytest.approx(comp["dp"] / 10e9)
    assert out["comm"]["time_lower_bound_s"] == pytest.approx(
        comp["dp"] / 10e9 + comp["tp"] / 100e9)
    assert out["comm"]["explain"]["links.dp.time_s"]["value"] == ln["dp"]["time_s"]


def test_pipeline_across_hosts_is_timed_on_the_inter_link():
    out = predict({**GPT, "dp": 1, "tp": 4, "pp": 2, "nnodes": 2, "microbatches": 4,
                   "intra_bandwidth_GBps": 100.0, "inter_bandwidth_GBps": 10.0})
    ln = links_of(out)
    assert ln["pp"]["link"] == "inter" and ln["pp"]["bytes_per_rank"] > 0
    assert ln["pp"]["time_s"] == pytest.approx(out["comm"]["components"]["pp"] / 10e9)
    one_host = links_of(predict({**GPT, "dp": 1, "tp": 4, "pp": 2, "microbatches": 4,
                                 "intra_bandwidth_GBps": 100.0}))
    assert one_host["pp"]["link"] == "intra"
    assert one_host["pp"]["time_s"] == pytest.approx(ln["pp"]["time_s"] / 10)


def test_single_bandwidth_is_both_links_and_defaults_are_labelled():
    out = predict({**GPT, "dp": 8, "tp": 1, "pp": 1, "nnodes": 2, "bandwidth_GBps": 25.0})
    assert links_of(out)["dp"]["link"] == "inter"
    assert {r["bandwidth_source"] for r in out["comm"]["links"]["per_axis"]} == \
        {"bandwidth_GBps"}
    assert out["comm"]["time_lower_bound_s"] == pytest.approx(
        out["comm"]["bytes_per_rank"] / 25e9)
    bare = predict({**GPT, "dp": 8, "tp": 1, "pp": 1, "nnodes": 2})
    assert bare["comm"]["time_lower_bound_s"] is None  # defaults alone ask for no time
    per = bare["comm"]["links"]["per_link"]
    assert per["inter"]["busbw_GBps"] == DEFAULT_INTER_GBPS
    assert per["intra"]["busbw_GBps"] == DEFAULT_INTRA_GBPS
    assert per["inter"]["bandwidth_source"].startswith("default")
    half = predict({**GPT, "dp": 8, "tp": 1, "pp": 1, "nnodes": 2, "bandwidth_GBps": 25.0,
                    "inter_bandwidth_GBps": 5.0})
    assert half["comm"]["links"]["per_link"]["intra"]["busbw_GBps"] == 25.0
    assert half["comm"]["time_lower_bound_s"] == pytest.approx(
        half["comm"]["bytes_per_rank"] / 5e9)


@pytest.mark.parametrize("extra,loc,fragment", [
    ({"nnodes": 3}, ["nnodes"], "must divide dp*tp*pp = 8"),
    ({"nnodes": 2, "nproc_per_node": 2}, ["nproc_per_node"], "must equal dp*tp*pp = 8"),
    ({"nproc_per_node": 0}, ["nproc_per_node"], "between 1 and 1024"),
    ({"inter_bandwidth_GBps": 0}, ["inter_bandwidth_GBps"], "must be > 0"),
])
def test_whatif_host_fields_are_validated(extra, loc, fragment):
    with pytest.raises(SpecError) as exc:
        predict({**GPT, "dp": 8, "tp": 1, "pp": 1, **extra})
    assert any(e["loc"] == loc and fragment in e["msg"] for e in exc.value.errors), \
        exc.value.errors


def test_spec_prediction_with_a_host_what_if_and_a_multi_host_spec():
    spec = parse_spec({"preset": "ddp", "parallel": {"dp": 4},
                       "runtime": {"nproc_per_node": 4}})
    assert {r["link"] for r in predict(spec)["comm"]["links"]["per_axis"]} == {"intra"}
    two = predict(spec, nnodes=2, inter_bandwidth_GBps=12.5)
    assert two["inputs"]["nproc_per_node"] == 2 and links_of(two)["dp"]["link"] == "inter"
    assert links_of(two)["dp"]["busbw_GBps"] == 12.5
    # a multi-host spec itself (runtime.nnodes = 2): the same attribution, from the spec
    multi = parse_spec({"preset": "ddp", "parallel": {"dp": 4}, "runtime": {"nnodes": 2}})
    assert links_of(predict(multi))["dp"]["link"] == "inter"
    with pytest.raises(SpecError) as exc:
        parse_spec({"preset": "ddp", "parallel": {"dp": 4}, "runtime": {"nnodes": 0}})
    assert exc.value.errors[0]["loc"] == ["runtime", "nnodes"]
