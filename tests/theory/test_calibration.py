"""jobs.theory.calibration: Spearman's rho with ties, and the ranking re-stated per term."""

from __future__ import annotations

import pytest

from jobs.theory.calibration import average_ranks, restate, spearman


def test_average_ranks_share_ties():
    assert average_ranks([3.0, 1.0, 2.0]) == [3.0, 1.0, 2.0]
    assert average_ranks([1.0, 2.0, 2.0, 5.0]) == [1.0, 2.5, 2.5, 4.0]


@pytest.mark.parametrize(("xs", "ys", "rho"), [
    ([1, 2, 3, 4], [10, 20, 30, 40], 1.0),
    ([1, 2, 3, 4], [40, 30, 20, 10], -1.0),
    ([1, 2, 3, 4], [10, 30, 20, 40], 0.8),   # one adjacent swap of four: 1 - 6*2/(4*15)
    ([1, 2, 3], [5, 5, 6], 0.8660254037844387),  # a tie: Pearson on average ranks
])
def test_spearman_known_values(xs, ys, rho):
    assert spearman(xs, ys) == pytest.approx(rho)


def test_spearman_undefined_below_three_or_constant():
    assert spearman([1, 2], [2, 1]) is None
    assert spearman([1, 2, 3], [4, 4, 4]) is None


def member(i, pred, meas):
    return {"label": f"m{i}", "index": i,
            "predicted": {"step_time_s": pred, "compute_s": pred * 0.8, "bubble_s": 0.0,
                          "comm_s": pred * 0.2},
            "measured": None if meas is None else {
                "step_time_s": meas, "compute_s": meas * 0.7, "bubble_s": None,
                "exposed_comm_s": meas * 0.2, "idle_s": meas * 0.1}}


def test_restate_orders_by_measured_and_scores_each_term():
    out = restate([member(0, 1.0, 1.2), member(1, 2.0, 3.0), member(2, 3.0, 2.5),
                   member(3, 4.0, None)])
    assert out["n"] == 3
    assert [r["label"] for r in out["rows"]] == ["m0", "m2", "m1", "m3"]  # unmeasured last
    assert out["spearman"] == pytest.approx(0.5)
    m1 = next(r for r in out["rows"] if r["label"] == "m1")
    assert (m1["predicted_rank"], m1["measured_rank"]) == (2.0, 3.0)
    assert m1["terms"]["step"]["error_s"] == pytest.approx(-1.0)
    assert m1["terms"]["step"]["error_pct"] == pytest.approx(-100 / 3)
    assert m1["terms"]["compute"]["error_s"] == pytest.approx(1.6 - 2.1)
    # no pipeline: the analysis has no bubble, the theory says 0; scored as 0 against 0
    assert m1["terms"]["bubble"] == {"predicted_s": 0.0, "measured_s": 0.0, "error_s": 0.0,
                                     "error_pct": None}
    assert out["terms"]["comm"]["members"] == 3
    assert out["terms"]["step"]["mean_error_s"] == pytest.approx((-0.2 - 1.0 + 0.5) / 3)
    m3 = out["rows"][-1]
    assert m3["measured_rank"] is None and m3["terms"]["step"]["error_s"] is None
