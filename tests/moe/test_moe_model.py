"""The MoE block on one process (no launch): deterministic top-k tie-break, the documented
capacity / drop rule, the Switch aux loss, the spec fields and their validation."""

from __future__ import annotations

import pytest
import torch

from jobs.models import gpt
from jobs.models.moe import MoE
from jobs.spec import SpecError, parse_spec
from jobs.theory.moe import a2a_bytes, expert_capacity

GPT = {"arch": "gpt", "layers": 1, "hidden": 8, "heads": 2, "seq_len": 4, "vocab": 16}


def block(**kw) -> MoE:
    torch.manual_seed(0)
    args = {"experts": 4, "top_k": 1, "capacity_factor": 0.0, "aux_loss_coef": 0.0,
            "router_bias": {}, "shared_expert": False, **kw}
    return MoE(8, make_mlp=gpt.MLP, **args)


def test_ties_go_to_the_lower_expert_and_capacity_keeps_first_choices_then_positions():
    m = block(top_k=2, capacity_factor=0.5,  # C = ceil(0.5 * 4 * 2 / 4) = 1 per sequence
              capacity_scope="sequence")
    torch.nn.init.zeros_(m.router.weight)  # every logit equal: all ties
    r = m.route(torch.randn(2, 4, 8))
    # every token's choices are experts 0 and 1; each keeps only its first assignment per
    # sequence: token 0's first choice (expert 0), token 0's second choice (expert 1)
    assert r.counts == [2, 2, 0, 0]
    assert r.token.tolist() == [0, 4, 0, 4]
    assert r.routed.tolist() == [8, 8, 0, 0] and r.dropped.tolist() == [6, 6, 0, 0]
    assert expert_capacity(0.5, 4, 2, 4) == 1
    # capacity_scope "rank" (the default): one group of the rank's 8 tokens, C = 2
    m.capacity_scope = "rank"
    r = m.route(torch.randn(2, 4, 8))
    assert r.counts == [2, 2, 0, 0] and r.token.tolist() == [0, 1, 0, 1]
    assert r.dropped.tolist() == [6, 6, 0, 0] and expert_capacity(0.5, 8, 2, 4) == 2


def test_aux_loss_is_one_when_router_probabilities_are_uniform():
    m = block(top_k=2)
    torch.nn.init.zeros_(m.router.weight)
    assert float(m.route(torch.randn(3, 4, 8)).aux.detach()) == pytest.approx(1.0)


def test_router_bias_makes_an_expert_hot_and_aux_grad_reaches_the_router():
    m = block(router_bias={2: 5.0}, aux_loss_coef=1.0)
    x = torch.randn(2, 4, 8)
    m(x).sum().backward()
    assert m.stats["tokens_per_expert"][2] == 8
    g_with = m.router.weight.grad.clone()
    m.zero_grad()
    m.aux_loss_coef = 0.0
    m(x).sum().backward()
    # the change is exactly d(aux)/dW, aux written here from Switch Transformer eq. 4 per
    # sequence: E * sum_e f_e * P_e, f_e = share of the sequence's top-1 choices (expert 2
    # for every token under the +5 bias), P_e = mean router probability; mean over sequences
    w = m.router.weight.detach().clone().requires_grad_(True)
    probs = torch.softmax(x @ w.T + torch.tensor([0.0, 0.0, 5.0, 0.0]), -1)  # (b, s, E)
    f = torch.zeros(4)
    f[2] = 1.0
    aux = (4 * (f * probs.mean(1)).sum(-1)).mean()
    (want,) = torch.autograd.grad(aux, w)
    assert want.abs().max() > 1e-4  # a change the comparison can see
    torch.testing.assert_close(g_with - m.router.weight.grad, want, rtol=1e-4, atol=1e-7)


def test_model_is_deterministic_under_the_seed_and_dense_default_unchanged():
    s = parse_spec({"model": {**GPT, "experts": 4, "top_k": 2, "shared_expert": True},
                    "runtime": {"nproc_per_node": 1}})
    a, b = gpt.build(s.model, 3), gpt.build(s.model, 3)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert "blocks.0.mlp.experts.3.fc2.weight" in dict(a.named_parameters())
    dense = gpt.build(parse_spec({"model": GPT, "runtime": {"nproc_per_node": 1}}).model, 3)
    assert "blocks.0.mlp.fc1.weight" in dict(dense.named_parameters())


def errors(data) -> list[tuple]:
    with pytest.raises(SpecError) as exc:
        parse_spec(data, max_world_size=8)
    return [(tuple(e["loc"]), e["msg"]) for e in exc.value.errors]


def moe_spec(model=None, par=None, n=4, train=None):
    return {"model": {**GPT, "experts": 4, **(model or {})}, "parallel": {"dp": n, **(par or {})},
            "runtime": {"nproc_per_node": n}, "train": {"global_batch": 8, **(train or {})}}


@pytest.mark.parametrize("data, loc, words", [
    (moe_spec(par={"ep": 3}), ("parallel", "ep"), "must divide dp = 4"),
    (moe_spec(model={"experts": 6}, par={"ep": 4}), ("parallel", "ep"),
     "must divide model.experts = 6"),
    (moe_spec(model={"top_k": 5}), ("model", "top_k"), "must be <= model.experts = 4"),
    (moe_spec(model={"router_bias": "9:1"}), ("model", "router_bias"), "expert 9 is outside"),
    (moe_spec(model={"router_bias": "x"}), ("model", "router_bias"), "is not EXPERT:BIAS"),
    (moe_spec(model={"arch": "mlp"}), ("model", "experts"), "needs arch 'gpt'"),
    ({"model": {**GPT, "top_k": 2}, "parallel": {"ep": 2, "dp": 2}},
     ("model", "top_k"), "needs model.experts > 0"),
    (moe_spec(par={"ep": 2, "zero_stage": 3}), ("parallel", "zero_stage"), "ZeRO-3"),
    (moe_spec(par={"ep": 2, "dp_mode": "ps"}), ("parallel", "dp_mode"), "allreduce"),
    (moe_spec(par={"ep": 2, "engine": "native"}), ("parallel", "engine"), "reference"),
    (moe_spec(par={"dp": 2, "tp": 2, "sequence_parallel": True}),
     ("parallel", "sequence_parallel"), "partial sequences"),
    (moe_spec(par={"dp": 2, "tp": 2, "engine": "native"}), ("parallel", "engine"), "DTensor"),
    (moe_spec(par={"ep": 2}, train={"precision": "bf16"}), ("train", "precision"), "fp32"),
])
def test_validation_names_field_and_rule(data, loc, words):
    errs = errors(data)
    assert any(e[0] == loc and words in e[1] for e in errs), errs


def test_moe_runs_inside_a_pipeline_with_the_tested_schedules_only():
    """1F1B and GPipe compose with experts (tests/moe/test_ep.py); zero-bubble, which splits
    the backward, is refused at submit as not available, with the list of what is."""
    s = parse_spec(moe_spec(model={"layers": 2}, par={"dp": 2, "pp": 2, "ep": 2,
                                                      "microbatches": 2}),
                   require_available=True)
    assert s.strategy == "ddp+pp-1f1b+moe-ep"
    with pytest.raises(SpecError) as e:
        parse_spec(moe_spec(model={"layers": 2}, par={"dp": 2, "pp": 2, "microbatches": 2,
                                                  "pp_schedule": "zero-bubble"}),
                   require_available=True)
    assert "'ddp+pp-zb+moe' is not available yet" in str(e.value)


def test_presets_and_labels():
    assert parse_spec({"preset": "moe"}).strategy == "ddp+moe"
    s = parse_spec({"preset": "moe-ep"})
    assert s.strategy == "ddp+moe-ep" and s.parallel.ep == 2 and s.model.experts == 4
    s = parse_spec({"preset": "moe-ep", "parallel": {"dp": 4}, "runtime": {"nproc_per_node": 4}})
    assert s.parallel.ep == 2
    assert parse_spec({"parallel": {"dp": 2}}).model.experts == 0  # dense by default


def test_theory_refuses_more_kept_assignments_than_capacity_allows():
    # 2 sequences of 4, 4 experts, top-2, capacity 1: at most 2 * 4 * 1 = 8 kept of 16
    assert a2a_bytes(tokens=8, hidden=8, top_k=2, experts=4, ep=2, seq_len=4,
                     capacity_factor=0.5, dropped=8)["payload"] == 4 * 8 * 8 * 4
    with pytest.raises(ValueError):
        a2a_bytes(tokens=8, hidden=8, top_k=2, experts=4, ep=2, seq_len=4,
                  capacity_factor=0.5, dropped=7)
