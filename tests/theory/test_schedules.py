"""The schedule simulator: action orders, dependencies and the closed-form bubbles."""

from collections import Counter

import pytest

from jobs.schedules import (
    SCHEDULES,
    Action,
    closed_form_bubble,
    dependencies,
    explore,
    placement_of,
    rank_of,
    schedule_actions,
    simulate,
    stage_of,
)

CASES = [(s, p, m, v) for s in ("gpipe", "1f1b") for p in (1, 2, 3, 4) for m in (1, 2, 4, 8)
         for v in (1,)] + \
        [("interleaved", p, m, v) for p in (2, 4) for m in (p, 2 * p, 4 * p) for v in (2, 3)]
TIMES = [(1.0, 1.0, 1.0), (1.0, 1.5, 0.5), (0.01, 0.02, 0.0)]


def _str(ranks):
    return [[str(a) for a in acts] for acts in ranks]


def test_gpipe_order():
    assert _str(schedule_actions("gpipe", 2, 3)) == [
        ["F0", "F1", "F2", "BW0", "BW1", "BW2"]] * 2


def test_1f1b_order_warmup_steady_cooldown():
    # p = 4, m = 6: rank r warms up with p-1-r forwards (Megatron non-interleaved)
    acts = _str(schedule_actions("1f1b", 4, 6))
    assert acts[0] == ["F0", "F1", "F2", "F3", "BW0", "F4", "BW1", "F5", "BW2", "BW3", "BW4",
                       "BW5"]
    assert acts[3] == ["F0", "BW0", "F1", "BW1", "F2", "BW2", "F3", "BW3", "F4", "BW4", "F5",
                       "BW5"]


def test_zero_bubble_is_zb_h1_order():
    # stage i steady triple (F_x, B_{x-(p-1-i)}, W_{x-(p-1)}), Qi et al. 2023
    acts = _str(schedule_actions("zero-bubble", 4, 8))
    assert acts[0][:8] == ["F0", "F1", "F2", "F3", "B0", "W0", "F4", "B1"]
    assert acts[3][:7] == ["F0", "B0", "F1", "B1", "F2", "B2", "F3"]
    assert acts[3][-3:] == ["W5", "W6", "W7"]


@pytest.mark.parametrize("schedule,p,m,v", CASES + [("zero-bubble", p, m, 1) for p in (1, 2, 4)
                                                    for m in (1, 3, 8)])
def test_every_rank_runs_each_action_once(schedule, p, m, v):
    ranks = schedule_actions(schedule, p, m, v)
    assert len(ranks) == p
    for r, acts in enumerate(ranks):
        c = Counter((a.kind, a.mb, a.chunk) for a in acts)
        assert all(n == 1 for n in c.values())
        kinds = ("F", "B", "W") if schedule == "zero-bubble" else ("F", "BW")
        assert set(c) == {(k, j, ch) for k in kinds for j in range(m) for ch in range(v)}
        assert all(a.stage == a.chunk * p + r for a in acts)


def test_interleaved_chunk_order_megatron():
    # p = 2, m = 4, v = 2: rank 0 warms up with (p-r-1)*2 + (v-1)*p = 4 forwards
    acts = _str(schedule_actions("interleaved", 2, 4, 2))
    assert acts[0][:5] == ["F0", "F1", "F0c1", "F1c1", "F2"]
    assert acts[0][5] == "BW0c1"


@pytest.mark.parametrize("schedule,p,m,v", CASES)
@pytest.mark.parametrize("tf,tb,tw", TIMES)
def test_closed_form_comes_out_of_the_simulator(schedule, p, m, v, tf, tb, tw):
    # seed 000: GPipe/1F1B (p-1)/m of ideal time, interleaved 1/v of that; over total time
    # (p-1)/(v*m+p-1) (seed 002's "(P-1)/(P-1+M)").
    out = simulate(schedule, p, m, v, tf, tb, tw)
    for rank in out["ranks"]:
        assert rank["idle_fraction"] == pytest.approx((p - 1) / (v * m + p - 1), abs=1e-9)
        assert rank["idle_over_busy"] == pytest.approx((p - 1) / (v * m), abs=1e-9)
    assert out["closed_form"]["total"] == pytest.approx(out["bubble_fraction"])
    assert out["closed_form"]["ideal"] == pytest.approx(out["bubble_over_ideal"])
    assert out["makespan_s"] == pytest.approx((v * m + p - 1) * (tf + tb + tw))


def test_seed000_interleaved_cuts_bubble_by_v():
    # seed 000: "BubbleFraction_interleaved = 1/v * (p-1)/m"
    one = simulate("1f1b", 4, 8)["bubble_over_ideal"]
    for v in (2, 4):
        assert simulate("interleaved", 4, 8, v)["bubble_over_ideal"] == pytest.approx(one / v)


def test_seed002_gpipe_gantt_corrected():
    # seed 002 draws GPipe p=4, m=4, 1 s per F and B ending at t=11; with the dependencies
    # respected it ends at (m+p-1)*(t_f+t_b) = 14 (docs/conventions.md, inconsistent examples)
    out = simulate("gpipe", 4, 4, 1, 1.0, 1.0, 0.0)
    assert out["makespan_s"] == 14.0
    r3 = out["ranks"][3]["spans"]
    assert [(s["kind"], s["start"]) for s in r3[:2]] == [("F", 3.0), ("F", 4.0)]
    assert out["ranks"][0]["idle_s"] == 6.0


def test_naive_is_sequential():
    out = simulate("naive", 4, 1, 1, 1.0, 1.0, 1.0)
    assert out["makespan_s"] == 12.0
    assert out["bubble_fraction"] == pytest.approx(3 / 4) == closed_form_bubble("naive", 4, 1)


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 16), (3, 5)])
def test_zero_bubble_h1_bubble(p, m):
    # ZB-H1 bubble (p-1)(t_F + t_B - t_W) vs 1F1B (p-1)(t_F + t_B + t_W) (Qi et al. 2023)
    tf, tb, tw = 1.0, 1.0, 1.0
    zb = simulate("zero-bubble", p, m, 1, tf, tb, tw)
    f1 = simulate("1f1b", p, m, 1, tf, tb, tw)
    ideal = m * (tf + tb + tw)
    assert zb["makespan_s"] == pytest.approx(ideal + (p - 1) * (tf + tb - tw))
    assert f1["makespan_s"] == pytest.approx(ideal + (p - 1) * (tf + tb + tw))
    assert zb["closed_form"] is None
    # same peak activation memory as 1F1B (rank 0 holds p micro-batches; W lags B elsewhere)
    assert max(r["peak_inflight_microbatches"] for r in zb["ranks"]) == \
        max(r["peak_inflight_microbatches"] for r in f1["ranks"]) == p


def test_inflight_gpipe_m_vs_1f1b_p():
    # seed 000: "在途微批次：GPipe 需要 m，1F1B 仅需要 p"
    g = simulate("gpipe", 4, 8)
    f = simulate("1f1b", 4, 8)
    assert [r["peak_inflight_microbatches"] for r in g["ranks"]] == [8] * 4
    assert [r["peak_inflight_microbatches"] for r in f["ranks"]] == [4, 3, 2, 1]


def test_comm_bubble_split():
    out = simulate("1f1b", 2, 4, 1, 1.0, 1.0, 0.0, t_comm=0.5)
    base = simulate("1f1b", 2, 4, 1, 1.0, 1.0, 0.0)
    assert out["makespan_s"] > base["makespan_s"]
    for r, b in zip(out["ranks"], base["ranks"], strict=True):
        assert r["bubble"]["inherent_s"] == pytest.approx(b["idle_s"])
        assert r["bubble"]["comm_s"] == pytest.approx(out["makespan_s"] - base["makespan_s"])
    assert out["closed_form"] is None


def test_per_stage_times_imbalance():
    out = simulate("gpipe", 2, 2, 1, [1.0, 2.0], [1.0, 2.0], 0.0)
    # rank 1 (2 s per F and BW) waits 1 s for F0, then runs back to back; rank 0's last BW
    # closes the step: makespan 1 + 4*2 + 1 = 10, rank 1 idle 2, rank 0 busy 4
    assert out["makespan_s"] == pytest.approx(10.0)
    assert out["ranks"][1]["idle_s"] == pytest.approx(2.0)
    assert out["ranks"][0]["idle_s"] == pytest.approx(6.0)


def test_dependencies():
    assert dependencies(Action("F", 2, 0, 0), 2) == []
    assert dependencies(Action("F", 2, 1, 2), 2, 2) == [Action("F", 2, 0, 1)]
    assert dependencies(Action("BW", 1, 0, 1), 2) == [Action("F", 1, 0, 1)]
    assert dependencies(Action("B", 1, 0, 0), 2) == [Action("F", 1, 0, 0), Action("B", 1, 0, 1)]
    assert dependencies(Action("W", 1, 0, 0), 2) == [Action("B", 1, 0, 0)]


@pytest.mark.parametrize("bad", [("zigzag", 2, 4, 1), ("interleaved", 2, 3, 2),
                                 ("1f1b", 2, 4, 2), ("gpipe", 0, 4, 1), ("gpipe", 2, 0, 1)])
def test_rejects_bad_configs(bad):
    with pytest.raises(ValueError):
        schedule_actions(*bad)


def test_explore_is_json_ready():
    import json
    for s in SCHEDULES:
        m = 4
        out = explore(s, 2, m if s != "naive" else 1, 2 if s in ("interleaved", "zbv") else 1)
        json.dumps(out)
        assert "over total time" in out["convention"]


# --- ZB-V ----------------------------------------------------------------------------------------

def _torch_zbv_order(p, m):
    """torch's own ScheduleZBVZeroBubble per-rank compute order, built by its real constructor
    (which reads only group_size / num_stages / group_rank / submod of its stages, then computes
    every rank's order and validates it), as (kind, mb, stage) with its I -> our B."""
    from types import SimpleNamespace

    sch_mod = pytest.importorskip("torch.distributed.pipelining.schedules")
    stages = [SimpleNamespace(group_size=p, num_stages=2 * p, group_rank=0, submod=None,
                              stage_index=s) for s in (0, 2 * p - 1)]
    sch = sch_mod.ScheduleZBVZeroBubble(stages, n_microbatches=m)
    kind = {"F": "F", "I": "B", "W": "W"}
    return [[(kind[a.computation_type.value], a.microbatch_index, a.stage_index)
             for a in sch.pipeline_order[r] if a is not None] for r in range(p)]


@pytest.mark.parametrize("p,m", [(p, m) for p in (1, 2, 3, 4) for m in range(1, 3 * p + 3)] +
                         [(8, 15), (8, 16), (8, 4)])
def test_zbv_is_torch_schedule_zbv_zero_bubble(p, m):
    # torch accepts any m >= 1 (it pads to 2p-1 micro-batches and drops the extra actions)
    ours = [[(a.kind, a.mb, a.stage) for a in acts] for acts in schedule_actions("zbv", p, m, 2)]
    assert ours == _torch_zbv_order(p, m)


def test_zbv_torch_mapping_is_our_v_placement():
    utils = pytest.importorskip("torch.distributed.pipelining._utils")
    for p in (1, 2, 3, 4):
        want = utils.generate_stage_to_rank_mapping(p, 2 * p, style="v")
        assert {s: rank_of(s, p, 2, "v") for s in range(2 * p)} == want
        loop = utils.generate_stage_to_rank_mapping(p, 2 * p, style="loop")
        assert {s: rank_of(s, p, 2, "loop") for s in range(2 * p)} == loop


def test_placement_helpers():
    assert placement_of("zbv") == "v"
    assert {placement_of(s) for s in SCHEDULES if s != "zbv"} == {"loop"}
    assert [stage_of(r, c, 4, 2, "v") for r in range(4) for c in range(2)] == \
        [0, 7, 1, 6, 2, 5, 3, 4]
    assert [stage_of(r, c, 4, 2) for r in range(4) for c in range(2)] == [0, 4, 1, 5, 2, 6, 3, 7]
    for place in ("loop", "v"):
        for p, v in ((1, 1), (2, 2), (4, 2), (3, 3)):
            for r in range(p):
                for c in range(v):
                    s = stage_of(r, c, p, v, place)
                    assert rank_of(s, p, v, place) == r and s // p == c
    with pytest.raises(ValueError):
        placement_of("zigzag")
    with pytest.raises(ValueError):
        stage_of(0, 0, 2, 2, "w")


@pytest.mark.parametrize("p,m", [(1, 3), (2, 1), (2, 3), (2, 4), (4, 2), (4, 8), (3, 7)])
def test_zbv_every_rank_runs_each_action_once_in_a_v(p, m):
    for r, acts in enumerate(schedule_actions("zbv", p, m, 2)):
        c = Counter((a.kind, a.mb, a.chunk) for a in acts)
        assert all(n == 1 for n in c.values())
        assert set(c) == {(k, j, ch) for k in "FBW" for j in range(m) for ch in range(2)}
        assert {a.stage for a in acts} == {r, 2 * p - 1 - r}
        assert all(a.stage == stage_of(r, a.chunk, p, 2, "v") for a in acts)


@pytest.mark.parametrize("p", [1, 2, 3, 4])
def test_zbv_simulates_without_deadlock(p):
    for m in range(1, 3 * p + 2):
        for times in TIMES:
            out = simulate("zbv", p, m, 2, *times, t_comm=0.25)
            assert out["makespan_s"] > 0 and out["closed_form"] is None
            assert len(out["ranks"]) == p


@pytest.mark.parametrize("p,m", [(2, 4), (2, 8), (4, 8), (4, 16), (3, 5)])
def test_zbv_bubble_below_zb_h1(p, m):
    # same model on the same p ranks: a zbv chunk is half a ZB-H1 stage (times halved); the
    # fractions do not depend on the scale
    zbv = simulate("zbv", p, m, 2, 0.5, 0.5, 0.5)
    zb = simulate("zero-bubble", p, m, 1, 1.0, 1.0, 1.0)
    assert zbv["bubble_fraction"] < zb["bubble_fraction"]
    assert zbv["bubble_over_ideal"] < zb["bubble_over_ideal"]
    assert zbv["makespan_s"] < zb["makespan_s"]
    assert closed_form_bubble("zbv", p, m, 2) is None


def test_zbv_bubble_numbers():
    # equal t_f = t_b = t_w per chunk: only the start-up staggering is left, (p-1) t_f of idle
    # per rank once m >= 2p-1 (ZB-H1: (p-1)(t_F + t_B - t_W) per stage, twice as much)
    for p, m in ((2, 4), (4, 8), (4, 16)):
        out = simulate("zbv", p, m, 2)
        assert out["makespan_s"] == pytest.approx(2 * m * 3 + (p - 1))
        assert [r["idle_s"] for r in out["ranks"]] == pytest.approx([p - 1] * p)
    assert simulate("zbv", 2, 4, 2)["bubble_fraction"] == pytest.approx(1 / 25)
    assert simulate("zbv", 4, 8, 2)["bubble_fraction"] == pytest.approx(3 / 51)


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 16)])
def test_zbv_peak_inflight(p, m):
    # m >= 2p-1: every rank holds 2p chunks (p micro-batches of its two half-size chunks),
    # the activation memory of 1F1B's busiest rank
    out = simulate("zbv", p, m, 2)
    assert [r["peak_inflight_chunks"] for r in out["ranks"]] == [2 * p] * p
    assert [r["peak_inflight_microbatches"] for r in out["ranks"]] == [p] * p


def test_zbv_order_and_explore():
    acts = _str(schedule_actions("zbv", 2, 4, 2))
    assert acts[0][:9] == ["F0", "F1", "F2", "F0c1", "B0c1", "W0c1", "F1c1", "B1c1", "W1c1"]
    assert acts[1][:5] == ["F0", "F0c1", "F1", "F1c1", "B0c1"]
    out = explore("zbv", 2, 4, 2)
    assert out["actions"] == acts
    assert [s["stage"] for s in out["ranks"][0]["spans"] if s["chunk"] == 1] == [3] * 12


@pytest.mark.parametrize("v", [1, 3])
def test_zbv_needs_v_2(v):
    with pytest.raises(ValueError, match="v = "):
        schedule_actions("zbv", 2, 4, v)


def test_zbv_t_comm_not_between_stages_on_one_rank():
    # stages p-1 and p are both on rank p-1: their F / B hand-over costs no t_comm
    base = simulate("zbv", 2, 4, 2, 1.0, 1.0, 1.0)
    comm = simulate("zbv", 2, 4, 2, 1.0, 1.0, 1.0, t_comm=0.5)
    r1 = {(s["kind"], s["mb"], s["stage"]): s for s in comm["ranks"][1]["spans"]}
    assert r1[("F", 0, 2)]["start"] == r1[("F", 0, 1)]["end"]  # local hand-over
    assert r1[("F", 0, 1)]["start"] == pytest.approx(1.5)  # from rank 0: + t_comm
    assert comm["makespan_s"] > base["makespan_s"]
