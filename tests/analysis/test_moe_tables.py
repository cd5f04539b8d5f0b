"""MoE tables (issue 17 part 5): expert_load, all_to_all and their headline figures, from real
runs on 4 ranks (one launch) and from synthetic traces with known answers."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from devtools.oracle import analyze, analyze_run_dir
from jobs.analysis import from_records
from jobs.analysis.moe import all_to_all_table, expert_load_table, headline
from jobs.analysis.run import TABLES
from tests.analysis.synth import meta, span
from tests.support.launch import multirun, read_trace

MODEL = {"arch": "gpt", "layers": 2, "hidden": 16, "heads": 2, "seq_len": 8, "vocab": 32,
         "experts": 4, "top_k": 2, "aux_loss_coef": 0.1}


def spec(ep: int, model: dict) -> dict:
    return {"model": {**MODEL, **model}, "parallel": {"dp": 4, "ep": ep},
            "train": {"steps": 3, "global_batch": 8}, "runtime": {"nproc_per_node": 4}}


CAP = {"capacity_factor": 1.0, "router_bias": "3:2.5"}  # expert 3 hot, and over capacity
RUNS = [("ep1-cap", spec(1, CAP)), ("ep2-cap", spec(2, CAP)),
        ("ep4-dropless", spec(4, {"capacity_factor": 0.0, "router_bias": "1:2.5"}))]
HOT = {"ep1-cap": 3, "ep2-cap": 3, "ep4-dropless": 1}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("moe-tables")
    multirun(4, RUNS, out, timeout=240)
    return {name: out / name for name, _ in RUNS}


@pytest.fixture(scope="module")
def analyses(runs) -> dict[str, dict]:
    return {name: analyze_run_dir(d) for name, d in runs.items()}


def test_tables_are_registered():
    assert {"expert_load", "all_to_all"} <= set(TABLES)


@pytest.mark.parametrize("name", list(HOT))
def test_router_bias_makes_its_expert_the_hottest(analyses, name):
    a = analyses[name]
    assert a["headline"]["hottest_expert"] == HOT[name]
    per: dict[tuple, dict] = defaultdict(dict)
    for r in a["tables"]["expert_load"]:
        per[(r["step"], r["layer"])][r["expert"]] = r["tokens"]
    assert len(per) == 3 * 2  # steps x layers
    for load in per.values():  # hottest in every step and layer, not only overall
        assert max(load, key=load.get) == HOT[name]
    assert a["headline"]["expert_imbalance"] > 1.5


@pytest.mark.parametrize("name", list(HOT))
def test_load_counts_every_routed_assignment(runs, analyses, name):
    rows = analyses[name]["tables"]["expert_load"]
    want: dict[tuple, list] = defaultdict(lambda: [0, 0])
    for rank in range(4):
        for r in read_trace(runs[name], rank):
            if r.get("type") == "moe":
                w = want[(r["step"], r["layer"])]
                w[0] += r["tokens"] * MODEL["top_k"]
                w[1] += r["dropped"]
    got: dict[tuple, list] = defaultdict(lambda: [0, 0])
    for r in rows:
        g = got[(r["step"], r["layer"])]
        g[0] += r["tokens"]
        g[1] += r["dropped"]
    assert got == want and all(w[0] == 8 * 8 * 2 for w in want.values())  # batch x seq x k


def test_expert_parallelism_routes_like_the_replicated_run(analyses):
    ep1, ep2 = (analyses[n]["tables"]["expert_load"] for n in ("ep1-cap", "ep2-cap"))
    keys = ("step", "layer", "expert", "tokens", "dropped", "share", "imbalance")
    assert [[r[k] for k in keys] for r in ep2] == [[r[k] for k in keys] for r in ep1]
    assert [r["aux_loss"] for r in ep2] == pytest.approx([r["aux_loss"] for r in ep1], rel=1e-5)
    assert analyses["ep1-cap"]["tables"]["all_to_all"] == []  # ep = 1: no all-to-all


def test_dropped_fraction(analyses):
    h = analyses["ep2-cap"]["headline"]
    steady = [r for r in analyses["ep2-cap"]["tables"]["expert_load"] if r["step"] >= 1]
    assert h["dropped_tokens_fraction"] == pytest.approx(
        sum(r["dropped"] for r in steady) / sum(r["tokens"] for r in steady))
    assert 0 < h["dropped_tokens_fraction"] < 1
    assert analyses["ep4-dropless"]["headline"]["dropped_tokens_fraction"] == 0


@pytest.mark.parametrize("name,ep", [("ep2-cap", 2), ("ep4-dropless", 4)])
def test_all_to_all_rows_sum_to_traced_bytes_sent(runs, analyses, name, ep):
    rows = analyses[name]["tables"]["all_to_all"]
    sent: dict[tuple, float] = defaultdict(float)
    recv: dict[tuple, float] = defaultdict(float)
    for rank in range(4):
        for r in read_trace(runs[name], rank):
            if r.get("op") == "all_to_all" and r["step"] >= 0:
                sent[(r["step"], rank)] += r["bytes_sent"]
                recv[(r["step"], rank)] += r["bytes_recv"]
    rows_sum: dict[tuple, float] = defaultdict(float)
    col_sum: dict[tuple, float] = defaultdict(float)
    for r in rows:
        assert (r["src"] // ep == r["dst"] // ep) and (r["local"] == (r["src"] == r["dst"]))
        assert r["bytes"] == r["dispatch_bytes"] + r["combine_bytes"] + r["counts_bytes"]
        if not r["local"]:
            rows_sum[(r["step"], r["src"])] += r["bytes"]
            col_sum[(r["step"], r["dst"])] += r["bytes"]
    assert rows_sum == sent and col_sum == recv  # what src sent to dst is what dst got from src
    assert len(rows) == 3 * 4 * ep  # every (step, src, dst) of the EP groups


# -- synthetic: tensor-parallel replicas, exact numbers, partial traces


def moe_rec(rank, step, layer, tpe, dpe=None, mb=0):
    dpe = dpe or [0] * len(tpe)
    return {"type": "moe", "rank": rank, "step": step, "microbatch": mb, "ts_ns": 1000 * step,
            "layer": layer, "tokens": sum(tpe) // 2, "tokens_per_expert": tpe,
            "dropped_per_expert": dpe, "dropped": sum(dpe), "aux_loss": 1.0 + rank}


def a2a(rank, step, ep_rank, send, seq=0):
    me = send[ep_rank]
    return {"type": "comm", "rank": rank, "step": step, "microbatch": 0, "op": "all_to_all",
            "axis": "ep", "group": "ep", "seq": seq, "group_size": len(send),
            "payload_bytes": sum(send), "bytes_sent": float(sum(send) - me),
            "bytes_recv": 0.0, "what": "dispatch", "phase": "fwd", "layer": 0,
            "ep_rank": ep_rank, "send_bytes": send, "recv_bytes": [0] * len(send),
            "ts_ns": 1000 * step + 10, "dur_ns": 5}


def test_tensor_parallel_replicas_count_once_and_imbalance_is_max_over_mean():
    # dp 2 x tp 2: ranks 1 and 3 (tp 1) see the tokens of ranks 0 and 2
    recs = {}
    for r in range(4):
        c = {"pp": 0, "dp": r // 2, "tp": r % 2}
        recs[r] = [meta(r, 4, c)] + [moe_rec(r, st, 0, [6, 1, 1, 0], [2, 0, 0, 0])
                                     for st in range(3)]
    rows = expert_load_table(from_records(recs))
    assert [(x["expert"], x["tokens"], x["dropped"]) for x in rows if x["step"] == 1] == \
        [(0, 12, 4), (1, 2, 0), (2, 2, 0), (3, 0, 0)]
    assert {x["imbalance"] for x in rows} == {12 / 4}
    assert rows[0]["aux_loss"] == pytest.approx(2.0)  # mean of ranks 0 and 2 (1.0, 3.0)
    h = headline(rows)
    assert h == {"expert_imbalance": 3.0, "dropped_tokens_fraction": 8 / 32, "hottest_expert": 0}


def test_headline_is_the_median_of_the_worst_layer_over_steady_steps():
    recs = {0: [meta(0, 1)]}
    loads = {0: ([4, 0], [2, 2]), 1: ([3, 1], [2, 2]), 2: ([2, 2], [1, 3]), 3: ([2, 2], [4, 0])}
    for st, (l0, l1) in loads.items():  # worst layer per step: 2.0 (warm-up), 1.5, 1.5, 2.0
        recs[0] += [moe_rec(0, st, 0, l0), moe_rec(0, st, 1, l1)]
    rows = expert_load_table(from_records(recs))
    assert headline(rows)["expert_imbalance"] == 1.5
    assert headline([])["expert_imbalance"] is None


def test_all_to_all_places_destinations_by_dp_order_in_the_ep_group():
    # dp 4, ep 2: EP groups {0, 1} and {2, 3}; rank 3 is ep_rank 1 of the second
    recs = {}
    for r in range(4):
        send = [10 * (r + 1), 100 * (r + 1)]
        recs[r] = [meta(r, 4), span(r, 0, "step", 0, 100, cat="step"), a2a(r, 0, r % 2, send)]
    rows = {(x["src"], x["dst"]): x["bytes"] for x in all_to_all_table(from_records(recs))}
    assert rows == {(0, 0): 10, (0, 1): 100, (1, 0): 20, (1, 1): 200,
                    (2, 2): 30, (2, 3): 300, (3, 2): 40, (3, 3): 400}


def test_a_missing_rank_leaves_its_group_out_with_a_warning():
    recs = {r: [meta(r, 4), a2a(r, 0, r % 2, [8, 8])] for r in (0, 1, 2)}  # no rank 3
    tr = from_records(recs)
    out = analyze(tr)
    assert {x["src"] for x in out["tables"]["all_to_all"]} == {0, 1}
    assert any("all_to_all: rank 2" in w for w in out["warnings"])


def test_scale_path_reads_the_moe_records_it_finds(runs, tmp_path):
    """The columnar scale path loads the MoE records (axis_sums saw them in its read) and
    gives the Python path's expert_load and all_to_all tables."""
    import shutil

    from jobs.analysis import axis_sums, engine
    from jobs.analysis.storage import convert
    run = tmp_path / "ep2"
    shutil.copytree(runs["ep2-cap"], run, ignore=shutil.ignore_patterns(
        "*.parquet", "table-*", "analysis.json"))
    convert.convert_run_dir(run)
    assert axis_sums.axis_sums(run)["rare"]
    want, got = analyze_run_dir(run)["tables"], engine.analyze_columnar(run)["tables"]
    assert want["expert_load"] and want["all_to_all"]
    for name in ("expert_load", "all_to_all"):
        assert got[name] == want[name], name


def test_moe_traces_convert_from_their_blocks_as_from_their_lines(runs, tmp_path):
    """The MoE records' lists (`tokens_per_expert`, per-destination bytes) and the EP
    all-to-alls, as the job's flusher wrote them: blocks give the lines' file."""
    from tests.analysis.test_blocks import assert_blocks_give_the_lines_file
    for name, run in runs.items():
        paths = sorted(run.glob("trace-rank*.jsonl"))
        assert paths
        for path in paths:
            assert_blocks_give_the_lines_file(path, tmp_path / name)
