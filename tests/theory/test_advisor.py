"""The advisor (jobs/theory/advisor.py): every candidate is a spec the service accepts and fits,
the ranking is by predicted step time, the timed model's compute is exactly its configured
times, and seed 004's rules hold on the 8 x 8 GPT setting (or the reasons say why not)."""

import math

import pytest

from jobs.spec import SpecError, parse_spec
from jobs.theory.advisor import advise
from jobs.theory.compute import training_flops

GB = 1e9
TIMED = {"arch": "timed", "layers": 8, "hidden": 8, "t_forward": 0.02,
         "t_backward_input": 0.01, "t_backward_weight": 0.015}
ONE_HOST = {"hosts": 1, "devices_per_host": 4, "device_memory_bytes": 16 * GB,
            "intra_GBps": 2.0, "inter_GBps": 1.0}
GPT3B = {"arch": "gpt", "layers": 32, "hidden": 2560, "heads": 32, "seq_len": 2048,
         "vocab": 50304}
SEED004 = {"hosts": 8, "devices_per_host": 8, "device_memory_bytes": 80 * GB,
           "intra_GBps": 300, "inter_GBps": 25, "flops": 300e12}


@pytest.fixture(scope="module")
def seed004():
    return advise(GPT3B, 512, SEED004, top=10)


def _check_valid_and_fitting(out, cluster):
    world = cluster["hosts"] * cluster["devices_per_host"]
    assert out["candidates"]
    for c in out["candidates"]:
        spec = parse_spec(c["spec"], max_world_size=world, require_available=True)
        assert spec.world_size == world
        mem = c["predicted"]["memory_bytes"]
        assert mem == pytest.approx(sum(c["predicted"]["memory_components"].values()))
        assert mem <= cluster["device_memory_bytes"]
    steps = [c["predicted"]["step_s"] for c in out["candidates"]]
    assert steps == sorted(steps)
    assert [c["rank"] for c in out["candidates"]] == list(range(1, len(steps) + 1))
    n = out["counts"]
    assert n["considered"] == sum(n["pruned"].values()) + sum(n["invalid"].values()) + \
        n["not_fitting"] + n["fitting"]


def test_timed_candidates_valid_fitting_ranked():
    out = advise(TIMED, 8, ONE_HOST, top=50)
    _check_valid_and_fitting(out, ONE_HOST)
    assert "configured times" in out["conventions"]["compute"]


def test_timed_compute_is_exactly_the_configured_times():
    out = advise(TIMED, 8, ONE_HOST, top=50)
    per_layer = TIMED["t_forward"] + TIMED["t_backward_input"] + TIMED["t_backward_weight"]
    seen_pp, seen_hand = set(), set()
    for c in out["candidates"]:
        p, pred = c["layout"], c["predicted"]
        rounds = p["microbatches"]  # grad_accum = 1 in every advised spec
        assert pred["compute_s"] == pytest.approx(rounds * TIMED["layers"] / p["pp"] * per_layer,
                                                  rel=1e-12)
        # by hand: a stage's forward + backward of one micro-batch; GPipe and 1F1B idle
        # (pp - 1) of them (Narayanan et al. 2021), the interleaved schedule 1/v of that;
        # the zero-bubble schedules idle less than 1F1B
        fb = TIMED["layers"] / p["pp"] * per_layer
        if p["pp"] == 1:
            assert pred["bubble_s"] == 0
        elif p["pp_schedule"] in ("gpipe", "1f1b"):
            assert pred["bubble_s"] == pytest.approx((p["pp"] - 1) * fb, rel=1e-9)
            seen_hand.add(p["pp_schedule"])
        elif p["pp_schedule"] == "interleaved":
            assert pred["bubble_s"] == pytest.approx((p["pp"] - 1) * fb / p["virtual_stages"],
                                                     rel=1e-9)
            seen_hand.add(p["pp_schedule"])
        else:
            assert 0 <= pred["bubble_s"] < (p["pp"] - 1) * fb
        # the model state by hand: a stage's timed layers are h x h linears with bias, fp32
        # params 4 + grads 4 + Adam 8 bytes; ZeRO stage z shards optimizer / grads / params
        psi = TIMED["layers"] // p["pp"] * (TIMED["hidden"] ** 2 + TIMED["hidden"])
        z, dp = p["zero_stage"], p["dp"]
        comp = pred["memory_components"]
        assert (comp["params"], comp["grads"], comp["optimizer"]) == pytest.approx(
            (4 * psi / (dp if z >= 3 else 1), 4 * psi / (dp if z >= 2 else 1),
             8 * psi / (dp if z >= 1 else 1))), p
        assert pred["step_s"] == pytest.approx(pred["compute_s"] + pred["bubble_s"]
                                               + sum(pred["comm_s"].values()))
        seen_pp.add(p["pp"])
    assert seen_pp >= {1, 2, 4} and seen_hand == {"gpipe", "1f1b", "interleaved"}


def test_gpt_compute_from_flops_at_the_given_rate(seed004):
    c = seed004["candidates"][0]
    # Narayanan et al. 2021: 72 B s L h^2 (1 + s/(6h) + V/(12 L h)), 96 and V/(16 L h) with
    # recomputation; over 64 devices at 300 TFLOP/s
    B, s, L, h, V = 512, GPT3B["seq_len"], GPT3B["layers"], GPT3B["hidden"], GPT3B["vocab"]
    k, d = (96, 16) if c["layout"]["activation_checkpointing"] else (72, 12)
    flops = k * B * s * L * h * h * (1 + s / (6 * h) + V / (d * L * h))
    assert c["predicted"]["compute_s"] == pytest.approx(flops / SEED004["flops"] / 64)
    assert "300 TFLOP/s" in seed004["conventions"]["compute"]


def test_seed004_rules(seed004):
    _check_valid_and_fitting(seed004, SEED004)
    top = seed004["candidates"][:5]
    for c in top:
        lay, links = c["layout"], c["predicted"]["links"]
        assert lay["tp"] <= 8 and 8 % lay["tp"] == 0
        assert links["tp"] == "intra"
        assert lay["pp"] > 1 and links["pp"] == "inter"
    for c in seed004["candidates"]:
        rules = {r["rule"]: r for r in c["rules"]}
        assert set(rules) >= {"tp-inside-host", "pp-across-hosts", "zero3-or-pp-by-bandwidth",
                              "dp-for-the-rest", "small-batch-grad-accum"}
        for r in c["rules"]:  # a departure carries its figures
            if r["status"] == "breaks":
                assert any(ch.isdigit() for ch in r["why"]) and len(r["why"]) > 20
        assert c["why"] and c["why"][0].startswith("step ")


def test_seed004_neighbours_and_not_fitting(seed004):
    assert seed004["counts"]["not_fitting"] > 0
    for r in seed004["not_fitting"]:
        assert r["reason"].startswith("memory: ")
        assert r["memory_bytes"] > SEED004["device_memory_bytes"]
    kinds = {n["status"] for c in seed004["candidates"] for n in c["neighbours"]}
    assert "memory" in kinds and "invalid" in kinds
    mem = [n for c in seed004["candidates"] for n in c["neighbours"] if n["status"] == "memory"]
    assert all("B per rank > device 80.0 GB" in n["reason"] for n in mem)


def test_a_model_too_large_fits_nowhere():
    out = advise(GPT3B, 512, {**SEED004, "hosts": 1, "device_memory_bytes": 1 * GB})
    assert out["candidates"] == [] and out["counts"]["fitting"] == 0
    assert out["not_fitting"] and all(r["reason"].startswith("memory") for r in
                                      out["not_fitting"])


@pytest.mark.parametrize("model, batch, cluster, loc", [
    (TIMED, 8, {**ONE_HOST, "device_memory_bytes": -1}, ["cluster", "device_memory_bytes"]),
    (TIMED, 8, {**ONE_HOST, "hosts": 0}, ["cluster", "hosts"]),
    (TIMED, 8, {**ONE_HOST, "intra_GBps": math.nan}, ["cluster", "intra_GBps"]),
    (TIMED, 8, {**ONE_HOST, "colour": 1}, ["cluster", "colour"]),
    ({"preset": "nope"}, 8, ONE_HOST, ["model", "preset"]),
    ({**TIMED, "hidden": 0}, 8, ONE_HOST, ["model", "hidden"]),
    (GPT3B, 8, ONE_HOST, ["cluster", "flops"]),
    (TIMED, 0, ONE_HOST, ["global_batch"]),
])
def test_bad_input_names_the_field(model, batch, cluster, loc):
    with pytest.raises(SpecError) as exc:
        advise(model, batch, cluster)
    assert exc.value.errors[0]["loc"] == loc


def test_preset_model():
    out = advise({"preset": "pp-1f1b", "arch": "timed", "layers": 4}, 8, ONE_HOST)
    assert out["model"]["arch"] == "timed" and out["model"]["layers"] == 4
    assert out["candidates"]


def test_long_sequences_on_one_host_bring_context_parallel_candidates():
    """seq_len 8192 on one 8-device host: without recomputation only CP (each rank holding
    seq_len/cp tokens) fits, and the ranking prices its ring traffic on the cp axis."""
    model = {**GPT3B, "seq_len": 8192}
    cluster = {**SEED004, "hosts": 1}
    out = advise(model, 64, cluster, top=200)
    _check_valid_and_fitting(out, cluster)
    cps = [c for c in out["candidates"] if c["layout"]["cp"] > 1]
    assert cps, [c["label"] for c in out["candidates"]]
    for c in cps:
        assert c["spec"]["parallel"]["cp"] == c["layout"]["cp"] and c["label"].endswith(
            f"-cp{c['layout']['cp']}")
        assert c["predicted"]["comm_s"]["cp"] > 0 and c["predicted"]["links"]["cp"] == "intra"
        assert not c["layout"]["activation_checkpointing"]  # refused with cp: not tried
    best_cp = cps[0]
    assert any(n["change"].startswith("cp ") for n in best_cp["neighbours"])
    no_recompute = [c for c in out["candidates"]
                    if not c["layout"]["activation_checkpointing"]]
    # without CP only micro-batch size 1 fits (the second pass, smaller micro-batches where
    # none of the searched counts fits: issue 38)
    assert all(c["layout"]["cp"] > 1 or 64 // c["layout"]["dp"] == c["layout"]["microbatches"]
               for c in no_recompute)
    # the same layout with cp halved to 1 does not fit: the activations cp splits are why
    cp = best_cp["layout"]["cp"]
    halved = [n for n in best_cp["neighbours"] if n["change"] == f"cp {cp} -> {cp // 2}"]
    assert halved and halved[0]["status"] == "memory" and "activations" in halved[0]["reason"]


MOE = {"arch": "gpt", "layers": 16, "hidden": 1024, "heads": 16, "seq_len": 1024,
       "vocab": 32000, "experts": 8, "top_k": 2}


def test_moe_flops_reduce_to_dense_with_one_expert_per_token():
    dense = {k: v for k, v in MOE.items() if k not in ("experts", "top_k")}
    one = {**MOE, "top_k": 1}
    B, s, h, E = 4, MOE["seq_len"], MOE["hidden"], MOE["experts"]
    for ck, k in ((False, 72), (True, 96)):
        router = k / 12 * B * s * h * E * MOE["layers"]
        assert training_flops(one, B, ck)[0] == pytest.approx(
            training_flops(dense, B, ck)[0] + router)
        # each extra expert per token adds the dense MLP's 2/3 share of the 72*B*s*h^2 term
        assert training_flops(MOE, B, ck)[0] - training_flops(one, B, ck)[0] == \
            pytest.approx(2 / 3 * k * B * s * h * h * MOE["layers"])
        assert training_flops({**one, "shared_expert": True}, B, ck)[0] == \
            pytest.approx(training_flops(MOE, B, ck)[0])


def test_moe_model_brings_expert_parallel_candidates():
    cluster = {**SEED004, "hosts": 1, "device_memory_bytes": 16 * GB}
    out = advise(MOE, 64, cluster, top=60)
    _check_valid_and_fitting(out, cluster)
    eps = [c for c in out["candidates"] if c["layout"]["ep"] > 1]
    assert eps and out["candidates"][0]["layout"]["ep"] > 1
    for c in eps:
        assert c["spec"]["model"]["experts"] == 8 and c["spec"]["parallel"]["ep"] == \
            c["layout"]["ep"] and c["label"].endswith(f"-ep{c['layout']['ep']}")
        assert c["predicted"]["comm_s"]["ep"] > 0  # the all-to-alls are priced
    c = out["candidates"][0]
    assert not c["layout"]["activation_checkpointing"]
    # by hand, per token forward: attention's projections 8h^2 and scores 4sh, top_k
    # experts of the dense MLP's 16h^2 each, the router's 2hE, the LM head's 2hV; x 3
    # forward + backward
    B, s, L, h = 64, MOE["seq_len"], MOE["layers"], MOE["hidden"]
    flops = 3 * B * s * (L * (8 * h * h + 4 * s * h + MOE["top_k"] * 16 * h * h
                              + 2 * h * MOE["experts"]) + 2 * h * MOE["vocab"])
    assert c["predicted"]["compute_s"] == pytest.approx(flops / cluster["flops"] / 8)
    assert any(n["change"].startswith("ep ") for n in c["neighbours"])
    rule = next(r for r in c["rules"] if r["rule"] == "ep-inside-host")
    assert rule["status"] == "follows" and f"ep = {c['layout']['ep']}" in rule["why"]
