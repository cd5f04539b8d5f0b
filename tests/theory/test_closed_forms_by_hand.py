"""Closed forms at their edges, against hand computation:

- the naive (one micro-batch at a time) pipeline's bubble: with p stages each micro-batch takes
  p stage-times while each stage works 1 of them, so bubble / total = (p - 1) / p and
  bubble / ideal = (p - 1) (the ideal being the stage's own work);
- expert capacity rounds UP (Megatron-Core's get_capacity:
  ceil(num_tokens * topk / num_experts * capacity_factor)), so a fractional share never drops
  the token that does not fit a floor."""

from __future__ import annotations

import pytest
from pytest import approx

from jobs.schedules import closed_form_bubble
from jobs.theory.moe import expert_capacity


@pytest.mark.parametrize("p,m", [(2, 1), (4, 8), (8, 3)])
def test_naive_bubble_over_total_and_over_ideal(p, m):
    # m micro-batches, stage time 1: total p*m, each stage busy m -> bubble (p-1)*m
    total, busy = p * m, m
    bubble = total - busy
    assert closed_form_bubble("naive", p, m, convention="total") == approx(bubble / total)
    assert closed_form_bubble("naive", p, m, convention="ideal") == approx(bubble / busy)


def test_naive_bubble_one_stage_is_zero():
    assert closed_form_bubble("naive", 1, 4, convention="ideal") == 0


@pytest.mark.parametrize("cf,tokens,top_k,experts,want", [
    (1.0, 10, 1, 4, 3),     # 10 / 4 = 2.5 -> 3
    (1.25, 8, 2, 8, 3),     # 1.25 * 16 / 8 = 2.5 -> 3
    (1.0, 16, 2, 8, 4),     # exact: 4
    (1.1, 100, 1, 3, 37),   # 36.67 -> 37
    (0.5, 1, 1, 8, 1),      # 0.0625 -> at least 1
    (0.0, 100, 2, 8, 0),    # 0 = no limit
])
def test_expert_capacity_rounds_up(cf, tokens, top_k, experts, want):
    assert expert_capacity(cf, tokens, top_k, experts) == want
