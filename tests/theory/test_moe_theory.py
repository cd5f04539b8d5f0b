"""MoE / EP in predict() (jobs/theory/moe.py, ranks.py, comm_section.py, links.py), without a
launch: the MoE block's saved bytes against the saved-tensor counter on a real forward, the
EP model state under ZeRO, the ep / edp comm components and their link placement."""

from __future__ import annotations

import itertools

import pytest

from jobs.dims import ParallelDims
from jobs.memory import SavedTensorCounter, param_storages
from jobs.models import gpt
from jobs.models.moe import moe_blocks
from jobs.spec import parse_spec
from jobs.theory import predict
from jobs.theory.links import axis_crossing, brute_axis_crossing
from jobs.theory.moe import ep_model_state, expert_params, moe_saved_bytes, uniform_kept

# the aux loss keeps its graph (and the fraction f it saves) alive to backward, as in the
# presets; without it f is freed at the end of the forward and the theory leaves it out
MODEL = {"arch": "gpt", "layers": 2, "hidden": 16, "heads": 2, "seq_len": 8, "vocab": 32,
         "experts": 4, "top_k": 2, "aux_loss_coef": 0.01}


def one(model: dict, batch: int) -> dict:
    return {"model": model, "train": {"global_batch": batch}, "runtime": {"nproc_per_node": 1}}


def measured_and_kept(model_spec: dict, batch: int) -> tuple[int, list[int]]:
    """Saved bytes of one forward (as jobs/runners.py counts them) and the kept assignments
    of every MoE block."""
    spec = parse_spec(one(model_spec, batch))
    model = gpt.build(spec.model, 0)
    x, y = gpt.batch(spec.model, batch, 0, 0)
    c = SavedTensorCounter(param_storages(model))
    with c.hooks():
        gpt.loss_fn(model(x), y)
    kept = [sum(b.stats["tokens_per_expert"]) - sum(b.stats["dropped_per_expert"])
            for _, b in moe_blocks(model)]
    return c.bytes, kept


@pytest.mark.parametrize("extra", [
    {},                                                  # top-2, dropless
    {"top_k": 1},                                        # no gate renormalisation
    {"shared_expert": True, "router_bias": "1:1.5"},     # shared expert, a hot expert
    {"capacity_factor": 1.0},                            # drops: A < T*k
    {"capacity_factor": 0.5, "experts": 8, "top_k": 3},  # capacity-limited everywhere
])
def test_moe_activations_equal_the_saved_tensor_count(extra):
    """predict()'s activations (uniform routing) plus, per block, the kept-assignment
    correction of the observed routing equal the counter byte for byte."""
    m = {**MODEL, **extra}
    b = 4
    got, kept = measured_and_kept(m, b)
    pred = predict(one(m, b))["memory"]
    dims = {"batch": b, "seq_len": m["seq_len"], "hidden": m["hidden"],
            "experts": m["experts"], "top_k": m["top_k"],
            "capacity_factor": m.get("capacity_factor", 0.0),
            "shared_expert": m.get("shared_expert", False), "aux_loss": True}
    uniform = moe_saved_bytes(**dims)[0]
    corr = sum(moe_saved_bytes(**dims, kept=a)[0] - uniform for a in kept)
    assert pred["per_rank"][0]["activations"] + corr == got
    if not m.get("capacity_factor"):  # dropless: A = T*k whatever the routing
        assert corr == 0


def test_uniform_kept_is_the_capacity_bound():
    assert uniform_kept(32, 8, 2, 4) == 64                            # no capacity
    assert uniform_kept(32, 8, 2, 4, capacity_factor=1.0) == 64       # C = 4 = s*k/E
    assert uniform_kept(32, 8, 2, 4, capacity_factor=0.5) == 4 * 4 * 2  # C = 2 per expert


def test_ep_model_state_under_zero_and_dense_dp_bytes():
    s = {"model": {**MODEL, "hidden": 64, "layers": 4}, "parallel": {"dp": 4, "ep": 2,
                                                                      "zero_stage": 1},
         "runtime": {"nproc_per_node": 4}}
    p = predict(s)
    spec = parse_spec(s)
    psi_e = expert_params(4, 64, 4)
    want = ep_model_state(p["params"]["total"], psi_e, 4, 2, 1, bytes_params=4, bytes_grads=4,
                          bytes_optimizer=8)
    row = p["memory"]["per_rank"][0]
    assert {k: row[k] for k in want} == want
    assert {k: p["memory"]["components"][k] for k in want} == want
    assert p["params"]["per_rank"] == p["params"]["total"] - psi_e + psi_e // 2
    dense = p["params"]["total"] - psi_e
    c = p["comm"]["components"]
    assert c["dp"] == 2 * 3 / 4 * dense * 4  # ZeRO-1 on the non-expert Ψ only
    assert c["edp"] == 2 * 1 / 2 * psi_e / 2 * 4  # all-reduce over dp/ep = 2 ranks
    ep = p["comm"]["ep"]
    tokens = spec.train.global_batch // 4 * MODEL["seq_len"]
    a = tokens * 2  # per rank, dropless
    assert ep["group_payload"] == 4 * 2 * a * 64 * 4 * 4  # 4 passes x group x layers
    assert c["ep"] == 4 * (0.5 * 4 * a * 64 * 4 + 0.5 * 4 * 8)
    assert "uniform-routing" in p["comm"]["explain"]["components.ep"]["convention"]
    axes = {r["axis"] for r in p["comm"]["links"]["per_axis"]}
    assert {"ep", "edp"} <= axes


def test_no_ep_axes_without_expert_parallelism():
    for s in ({"preset": "moe"}, {"preset": "ddp"}):
        p = predict(s)
        assert set(p["comm"]["components"]) == {"dp", "tp", "pp"}
        assert p["comm"]["ep"] is None


@pytest.mark.parametrize("dp,tp,pp,ep,c", [
    x for x in itertools.product([2, 4, 8], [1, 2], [1, 2], [2, 4], [1, 2, 3, 4, 8])
    if x[0] % x[3] == 0])
def test_ep_edp_crossing_matches_the_listed_groups(dp, tp, pp, ep, c):
    """EP groups = ep consecutive dp ranks, expert-DP = the same index mod ep
    (jobs/parallel/expert.ep_groups), placed on hosts of c ranks."""
    dims = ParallelDims(dp=dp, tp=tp, pp=pp, world_size=dp * tp * pp)
    want = brute_axis_crossing(dims, c, ep)
    got = axis_crossing(dp, tp, pp, c, None, ep)
    assert {a: got[a]["groups_crossing"] for a in want} == want
    assert got["ep"]["groups"] == dims.world_size // ep


def test_ep_group_crosses_hosts_when_split():
    """dp 4 x ep 2 on two hosts of 2 ranks: EP groups (0,1), (2,3) stay inside a host, the
    expert-DP groups (0,2), (1,3) cross."""
    p = predict({"preset": "moe-ep", "parallel": {"dp": 4, "ep": 2},
                 "runtime": {"nnodes": 2, "nproc_per_node": 2}})
    links = {r["axis"]: r["link"] for r in p["comm"]["links"]["per_axis"]}
    assert links["ep"] == "intra" and links["edp"] == "inter"
