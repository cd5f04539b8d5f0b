"""Pipeline runtime: every schedule vs a single-process run; the actions every rank runs vs the
schedule simulator's (deterministic: the order, not wall-clock bubbles, which bench/bubble_real.py
measures on real compute); activation memory (GPipe m, 1F1B <= p); PP bytes. ZB-V (zbv) runs on
both engines: the reference runtime and torch's ScheduleZBVZeroBubble."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs import schedules
from jobs.analysis.storage.load import load_run_dir
from jobs.parallel.pipeline.stage import partition_by_cost, partition_even
from tests.support.launch import run_worker

HERE = Path(__file__).parent
ACTIONS = ("F", "B", "W", "BW")

# several torchrun launches (module fixtures), slower still on a loaded 2-core box
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SCHEDULES = ("naive", "gpipe", "1f1b", "interleaved", "zero-bubble", "zbv")


def test_partitions():
    assert partition_even(8, 4) == [2, 2, 2, 2]
    assert partition_even(5, 2) == [3, 2]
    assert partition_by_cost([1, 1, 1, 1, 4, 4], 2) == [5, 1] or \
        partition_by_cost([1, 1, 1, 1, 4, 4], 2) == [4, 2]
    assert partition_by_cost([4, 1, 1, 1, 1], 2) == [1, 4]


@pytest.fixture(scope="module")
def correct(tmp_path_factory):
    return run_worker(HERE / "pp_worker.py", 2, tmp_path_factory.mktemp("ppc"), "correct")


@pytest.mark.parametrize("arch", ["gpt", "mlp", "timed"])
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_schedule_matches_single_process(correct, arch, schedule):
    for r in correct["ranks"]:
        assert r[f"{arch}/{schedule}"]["err"] <= 1e-5


@pytest.mark.parametrize("arch", ["gpt", "mlp", "timed"])
def test_zbv_native_matches_single_process(correct, arch):
    # torch.distributed.pipelining.ScheduleZBVZeroBubble on V-placed PipelineStages
    for r in correct["ranks"]:
        assert r[f"{arch}/zbv/native"]["err"] <= 1e-5


def test_zbv_activation_memory(correct):
    # p = 2, m = 4 >= 2p-1: each rank holds 2p = 4 half-size chunks at its peak
    for r in correct["ranks"]:
        assert r["gpt/zbv"]["inflight_microbatches"] == 4


def test_activation_memory_gpipe_m_1f1b_p(correct):
    for r in correct["ranks"]:
        assert r["gpt/gpipe"]["inflight_microbatches"] == 4  # m
        assert r["gpt/1f1b"]["inflight_microbatches"] <= 2  # p
        assert r["gpt/1f1b"]["activation_bytes"] < r["gpt/gpipe"]["activation_bytes"]


@pytest.fixture(scope="module", params=[2, 4], ids=["p2", "p4"])
def bubble(request, tmp_path_factory):
    p = request.param  # timed layers that do not sleep: only the order of actions matters
    out = tmp_path_factory.mktemp(f"bubble{p}")
    return p, out, run_worker(HERE / "pp_worker.py", p, out, "bubble:0", timeout=600)


def traces(run) -> dict[int, list[dict]]:
    return load_run_dir(run).ranks


def test_actions_follow_the_simulator(bubble):
    """Every rank runs, in every step, exactly the actions (kind, micro-batch, chunk) the
    simulator schedules for it, in its order (torch's native ZB-V: the same actions; torch
    orders some of them differently)."""
    p, out, res = bubble
    names = list(res["ranks"][0])  # every schedule; zbv on the native engine at p = 2 only
    assert [n for n in names if n in SCHEDULES] == list(SCHEDULES)
    if p == 2:
        assert "zbv-native" in names
    for name in names:
        info = res["ranks"][0][name]
        want = schedules.schedule_actions(info["schedule"], p, info["m"], info["v"])
        for rank, recs in traces(out / name).items():
            mine = [(a.kind, a.mb, a.chunk) for a in want[rank]]
            for step in range(3):
                got = [(r["action"], r["microbatch"], r.get("chunk", 0)) for r in recs
                       if r.get("type") == "span" and r.get("action") in ACTIONS
                       and r["step"] == step]
                if info["engine"] == "native":
                    assert sorted(got) == sorted(mine), (name, rank, step)
                else:
                    assert got == mine, (name, rank, step)


def test_pp_bytes_are_activations_forward_and_gradients_backward(bubble):
    p, out, res = bubble
    info = res["ranks"][0]["1f1b"]
    act = 8 // info["m"] * 8 * 4  # micro-batch x hidden 8 x fp32 (pp_worker GB = 8)
    for rank, recs in traces(out / "1f1b").items():
        sends = [r for r in recs if r["type"] == "comm" and r["op"] == "send"]
        assert all(r["axis"] == "pp" and r["payload_bytes"] == act for r in sends)
        boundaries = (rank > 0) + (rank < p - 1)
        assert len(sends) == 3 * info["m"] * boundaries  # 3 steps x m per boundary
        assert {r["phase"] for r in sends} == ({"fwd"} if rank == 0 else
                                               {"bwd"} if rank == p - 1 else {"fwd", "bwd"})


def test_zbv_pp_bytes_skip_the_local_hand_over(bubble):
    # V placement: rank r holds stages r and 2p-1-r. Stage p-1 -> p (and its gradient back)
    # stays on rank p-1: no p2p record. A rank sends m activations a step across each of its
    # stages' forward boundaries to another rank, m gradients across each backward one, always
    # to a neighbouring rank (p = 2: rank 0 sends forward from stage 0 only, rank 1 from
    # stage 2 only; p = 4: the middle ranks send from both of their stages).
    p, out, res = bubble
    n = 2 * p

    def crossings(rank: int, step: int) -> int:
        mine = [schedules.stage_of(rank, c, p, 2, "v") for c in (0, 1)]
        return sum(0 <= s + step < n and schedules.rank_of(s + step, p, 2, "v") != rank
                   for s in mine)

    assert [crossings(r, 1) for r in range(p)] == ([1, 1] if p == 2 else [1, 2, 2, 1])
    for name in [x for x in ("zbv", "zbv-native") if x in res["ranks"][0]]:
        info = res["ranks"][0][name]
        act = 8 // info["m"] * 8 * 4
        for rank, recs in traces(out / name).items():
            sends = [r for r in recs if r["type"] == "comm" and r["op"] == "send"]
            assert all(abs(r["peer"] - rank) == 1 and r["payload_bytes"] == act
                       for r in sends), name
            for phase, step in (("fwd", 1), ("bwd", -1)):
                got = sum(r["phase"] == phase for r in sends)
                assert got == 3 * info["m"] * crossings(rank, step), (name, rank, phase, got)
