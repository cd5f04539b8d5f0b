"""MoE capacity as the frameworks define it (issue 38 item 5): `model.capacity_scope`.

Oracles that are not the code under test:
  - drops of a router with fixed logits counted by hand with Switch Transformer's / Megatron-Core's
    rule C = ceil(capacity_factor * N * top_k / E) over the N tokens of a group, first choices
    before second choices, earlier tokens first (GShard's priority, Megatron's "position"
    drop policy), for both scopes;
  - the expected drops under random routing against a Monte-Carlo simulation of the routing
    written here (not the model's router), within 4 standard errors of the simulation's mean;
  - expert parallelism against one process routing the same per-rank groups (the gate).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn

from jobs.models import gpt
from jobs.models.moe import MoE
from jobs.spec import SpecError, parse_spec
from jobs.theory.moe import expected_dropped
from tests.support.gate import TOL, rel_err, single_reference
from tests.support.launch import multirun, read_trace

E, S, B = 4, 4, 2  # experts, tokens per sequence, sequences the rank routes


class FixedLogits(nn.Module):
    """A router whose logits are given per token (b, s, E), whatever the input."""

    def __init__(self, logits: torch.Tensor):
        super().__init__()
        self.logits = logits

    def forward(self, x):
        return self.logits


def logits_for(choices: list[list[tuple]]) -> torch.Tensor:
    """Logits ranking each token's listed experts first, in order (3 > 2 > the rest 0)."""
    out = torch.zeros(len(choices), len(choices[0]), E)
    for b, seq in enumerate(choices):
        for s, ch in enumerate(seq):
            for rank, e in enumerate(ch):
                out[b, s, e] = 3.0 - rank
    return out


def block(scope: str, top_k: int, cf: float = 1.0) -> MoE:
    torch.manual_seed(0)
    return MoE(8, experts=E, top_k=top_k, capacity_factor=cf, aux_loss_coef=0.0,
               router_bias={}, shared_expert=False, make_mlp=gpt.MLP, capacity_scope=scope)


def route(scope: str, top_k: int, choices) -> object:
    m = block(scope, top_k)
    m.router = FixedLogits(logits_for(choices))
    return m.route(torch.zeros(B, S, 8))


TOP1 = [[(0,), (0,), (0,), (1,)], [(1,), (1,), (1,), (1,)]]
TOP2 = [[(0, 1), (0, 1), (0, 2), (1, 0)], [(0, 3), (0, 3), (2, 0), (3, 0)]]


def test_top1_drops_counted_by_hand_for_both_scopes():
    # sequence: C = ceil(1.0 * 4 * 1 / 4) = 1 per sequence. seq 0 sends 3 to expert 0 (2
    # dropped) and 1 to expert 1; seq 1 sends 4 to expert 1 (3 dropped): 5 dropped
    assert math.ceil(1.0 * S * 1 / E) == 1
    r = route("sequence", 1, TOP1)
    assert r.routed.tolist() == [3, 5, 0, 0]
    assert r.dropped.tolist() == [2, 3, 0, 0] and r.counts == [1, 2, 0, 0]
    assert r.token.tolist() == [0, 3, 4]
    # rank: C = ceil(1.0 * 8 * 1 / 4) = 2 over the rank's 8 tokens: expert 0 keeps flat tokens
    # 0, 1 (drops 2), expert 1 keeps 3, 4 (drops 5, 6, 7): 4 dropped
    assert math.ceil(1.0 * B * S * 1 / E) == 2
    r = route("rank", 1, TOP1)
    assert r.dropped.tolist() == [1, 3, 0, 0] and r.counts == [2, 2, 0, 0]
    assert r.token.tolist() == [0, 1, 3, 4]


def test_top2_drops_counted_by_hand_for_both_scopes():
    # sequence: C = ceil(1.0 * 4 * 2 / 4) = 2. seq 0: expert 0's queue is tokens 0, 1, 2
    # (first choices) then 3 (second): 2 dropped; expert 1's is 3 (first) then 0, 1: 1
    # dropped. seq 1: expert 0 gets 0, 1 (first) then 2, 3 (second): 2 dropped; expert 3
    # gets 3 (first) then 0, 1: 1 dropped. 6 of 16 dropped
    r = route("sequence", 2, TOP2)
    assert r.routed.tolist() == [8, 3, 2, 3]
    assert r.dropped.tolist() == [4, 1, 0, 1] and r.counts == [4, 2, 2, 2]
    # rank: C = ceil(1.0 * 8 * 2 / 4) = 4. Expert 0's queue: first choices of flat tokens
    # 0, 1, 2, 4, 5, then second choices of 3, 6, 7: keeps 0, 1, 2, 4, drops 4; the other
    # experts (3, 2, 3 assignments) keep all. 4 of 16 dropped
    assert math.ceil(1.0 * B * S * 2 / E) == 4
    r = route("rank", 2, TOP2)
    assert r.dropped.tolist() == [4, 0, 0, 0] and r.counts == [4, 3, 2, 3]
    assert r.token.tolist()[:4] == [0, 1, 2, 4]


def test_rank_groups_of_a_single_process_equal_the_ranks_routing_alone():
    """capacity_group splits a forward into the groups separate ranks would route: one forward
    of both sequences in groups of 1 drops what two forwards of one sequence each drop."""
    m = block("rank", 2)
    m.router = FixedLogits(logits_for(TOP2))
    m.capacity_group = 1
    together = m.route(torch.zeros(B, S, 8)).dropped
    apart = []
    for b in range(B):
        m.router = FixedLogits(logits_for(TOP2[b:b + 1]))
        m.capacity_group = None
        apart.append(m.route(torch.zeros(1, S, 8)).dropped)
    assert together.tolist() == (apart[0] + apart[1]).tolist() == [4, 1, 0, 1]


GPT = {"arch": "gpt", "layers": 1, "hidden": 8, "heads": 2, "seq_len": 4, "vocab": 16,
       "experts": 4}


def test_spec_default_is_rank_and_a_bad_scope_names_the_field():
    s = parse_spec({"model": GPT, "runtime": {"nproc_per_node": 1}})
    assert s.model.capacity_scope == "rank"
    assert gpt.build(s.model, 0).blocks[0].mlp.capacity_scope == "rank"
    with pytest.raises(SpecError) as exc:
        parse_spec({"model": {**GPT, "capacity_scope": "batch"},
                    "runtime": {"nproc_per_node": 1}})
    assert [tuple(e["loc"]) for e in exc.value.errors] == [("model", "capacity_scope")]
    with pytest.raises(SpecError) as exc:  # meaningless without experts
        parse_spec({"model": {**GPT, "experts": 0, "capacity_scope": "sequence"},
                    "runtime": {"nproc_per_node": 1}})
    assert [tuple(e["loc"]) for e in exc.value.errors] == [("model", "capacity_scope")]


def monte_carlo_drops(tokens: int, top_k: int, experts: int, cf: float, share=None,
                      trials: int = 4000, seed: int = 0) -> tuple[float, float]:
    """(mean, standard error) of the dropped assignments of one group of `tokens` tokens, each
    picking top_k distinct experts uniformly at random (or, top-1, expert e with probability
    share[e]); C = ceil(cf * tokens * top_k / experts), the excess over C dropped."""
    g = torch.Generator().manual_seed(seed)
    if share is None:
        pick = torch.rand(trials, tokens, experts, generator=g).argsort(-1)[..., :top_k]
    else:
        assert top_k == 1
        pick = torch.multinomial(torch.tensor(share).expand(trials * tokens, -1), 1,
                                 replacement=True, generator=g).view(trials, tokens, 1)
    load = torch.nn.functional.one_hot(pick, experts).sum(dim=(1, 2)).double()  # (trials, E)
    cap = math.ceil(cf * tokens * top_k / experts)
    drops = (load - cap).clamp(min=0).sum(-1)
    return float(drops.mean()), float(drops.std() / trials ** 0.5)


@pytest.mark.parametrize("tokens, top_k, experts, cf, share", [
    (256, 2, 8, 1.0, None),
    (256, 2, 16, 1.25, None),
    (128, 1, 4, 1.25, None),
    (128, 1, 4, 1.0, [0.4, 0.3, 0.2, 0.1]),  # an observed (skewed) router histogram
])
def test_expected_drops_are_positive_under_random_routing_and_match_monte_carlo(
        tokens, top_k, experts, cf, share):
    got = expected_dropped(tokens=tokens, top_k=top_k, experts=experts, capacity_factor=cf,
                           share=share)["value"]
    mean, se = monte_carlo_drops(tokens, top_k, experts, cf, share)
    assert got > 0.1  # not 0: random loads overflow C
    assert abs(got - mean) <= 4 * se + 1e-9, (got, mean, se)


def test_no_capacity_no_drops_and_the_rank_scope_drops_far_less():
    assert expected_dropped(tokens=256, top_k=2, experts=64, capacity_factor=0)["value"] == 0
    # the case: b = 8, s = 256, E = 64, top-2, cf 1.25, per sequence vs per rank
    seq = 8 * expected_dropped(tokens=256, top_k=2, experts=64, capacity_factor=1.25)["value"]
    rank = expected_dropped(tokens=8 * 256, top_k=2, experts=64, capacity_factor=1.25)["value"]
    assert seq > 20 * rank > 0


# expert parallelism on 2 ranks against one process (the gate), capacity over each rank's
# micro-batch of 2 sequences (global batch 8 = dp 2 x accum 2 x 2)
EP_MODEL = {"arch": "gpt", "layers": 2, "hidden": 16, "heads": 2, "seq_len": 8, "vocab": 32,
            "experts": 4, "top_k": 2, "aux_loss_coef": 0.1, "capacity_factor": 1.0}


def ep_spec(ep: int, scope: str) -> dict:
    return {"model": {**EP_MODEL, "capacity_scope": scope},
            "parallel": {"dp": 2, "ep": ep, "bucket_mb": 0.001},
            "train": {"steps": 2, "global_batch": 8, "optimizer": "sgd", "lr": 0.1,
                      "grad_accum": 2},
            "runtime": {"nproc_per_node": 2}}


EP_RUNS = [("ep2-rank", ep_spec(2, "rank")), ("ep2-sequence", ep_spec(2, "sequence"))]


def test_ep_equals_one_process_routing_the_same_groups(tmp_path):
    multirun(2, EP_RUNS, tmp_path)
    for name, s in EP_RUNS:
        d = tmp_path / name
        got = torch.load(d / "grads-step0.pt")
        ref = single_reference(s)
        assert rel_err(got, ref["grads"]) <= TOL, name
        assert rel_err(torch.load(d / "params-final.pt"), ref["params"]) <= TOL, name
        recs = [r for k in range(2) for r in read_trace(d, k) if r["type"] == "moe"]
        assert sum(r["dropped"] for r in recs) > 0, name
        assert {r["tokens"] for r in recs} == {2 * 8}  # the rank's micro-batch routed
    # the comparison can fail: the same rank-scope run against one process whose groups are
    # single sequences (the old rule) or the whole global batch
    from jobs.spec import parse_spec as ps
    from tests.support.gate import reference
    one = ps({**EP_RUNS[0][1], "parallel": {"dp": 1}, "runtime": {"nproc_per_node": 1}})
    got = torch.load(tmp_path / "ep2-rank" / "grads-step0.pt")
    for group in (1, 8):
        assert rel_err(got, reference(one, capacity_group=group)["grads"]) > 100 * TOL, group


@pytest.mark.parametrize("scope, groups, n", [("rank", 1, 32), ("sequence", 4, 8)])
def test_predict_reports_the_expected_drops_of_random_routing(scope, groups, n):
    """predict()'s `moe` section: > 0 for random routing at capacity_factor 1 (the old
    prediction's uniform routing dropped nothing), equal to a Monte-Carlo of the rank's
    groups (4 sequences of 8 tokens, top-2 of 4 experts) within 4 standard errors."""
    from jobs.theory import predict
    m = {**GPT, "seq_len": 8, "top_k": 2, "capacity_factor": 1.0, "capacity_scope": scope}
    p = predict({"model": m, "train": {"global_batch": 4}, "runtime": {"nproc_per_node": 1}})
    got = p["moe"]
    assert got["capacity_scope"] == scope and got["group_tokens"] == n
    assert got["capacity"] == math.ceil(1.0 * n * 2 / 4)
    mean, se = monte_carlo_drops(n, 2, 4, 1.0, trials=20000)
    want = groups * mean
    assert got["expected_dropped_per_microbatch"] > 0.5
    assert abs(got["expected_dropped_per_microbatch"] - want) <= 4 * groups * se, (got, want)


def test_the_layer_with_random_logits_drops_what_the_prediction_expects():
    """The MoE layer itself under random routing (iid Gaussian logits): 1000 capacity groups of
    2 sequences x 16 tokens, top-2 of 8, cf 1.0; its mean drops per group against
    expected_dropped within 4 standard errors (the standard error from the Monte-Carlo above
    with as many groups)."""
    groups, g, s, e, k = 1000, 2, 16, 8, 2
    torch.manual_seed(1)
    m = MoE(8, experts=e, top_k=k, capacity_factor=1.0, aux_loss_coef=0.0, router_bias={},
            shared_expert=False, make_mlp=gpt.MLP, capacity_scope="rank")
    m.router = FixedLogits(torch.randn(groups * g, s, e))
    m.capacity_group = g
    got = float(m.route(torch.zeros(groups * g, s, 8)).dropped.sum()) / groups
    want = expected_dropped(tokens=g * s, top_k=k, experts=e, capacity_factor=1.0)["value"]
    _, se = monte_carlo_drops(g * s, k, e, 1.0, trials=groups)
    assert want > 1 and abs(got - want) <= 4 * se, (got, want, se)
