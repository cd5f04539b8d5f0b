"""The schedule simulator: action orders, dependencies and the closed-form bubbles."""

from collections import Counter

import pytest

from jobs.schedules import (
    SCHEDULES,
    Action,
    closed_form_bubble,
    dependencies,
    explore,
    schedule_actions,
    simulate,
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
        out = explore(s, 2, m if s != "naive" else 1, 2 if s == "interleaved" else 1)
        json.dumps(out)
        assert "over total time" in out["convention"]
