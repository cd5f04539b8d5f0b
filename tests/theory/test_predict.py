"""predict(): input validation, output shape, JobSpec path, parameter counts, the inconsistent seed
examples with their corrected values (docs/conventions.md)."""

import json

import pytest

from jobs.schedules import simulate
from jobs.spec import PRESETS, SpecError, parse_spec
from jobs.theory import (
    allreduce_algorithms,
    model_state_bytes,
    param_count,
    predict,
    stage_params,
    stage_times,
)

B = 1_000_000_000
GB = 1e9
BASE = {"params": B, "dp": 2, "tp": 1, "pp": 1, "zero_stage": 0, "memory_model": "16psi"}


# --- validation ----------------------------------------------------------------------------------

@pytest.mark.parametrize("patch,loc,typ", [
    ({"dp": 0}, ["dp"], "greater_than_equal"),
    ({"dp": "2"}, ["dp"], "int_type"),
    ({"zero_stage": 4}, ["zero_stage"], "range"),
    ({"memory_model": "18psi"}, ["memory_model"], "enum"),
    ({"bandwidth_GBps": 0}, ["bandwidth_GBps"], "greater_than"),
    ({"pp_schedule": "zigzag"}, ["pp_schedule"], "enum"),
    ({"sequence_parallel": 1}, ["sequence_parallel"], "bool_type"),
    ({"bogus": 1}, ["bogus"], "extra_forbidden"),
    ({"virtual_stages": 2}, ["virtual_stages"], "value_error"),
    ({"pp": 4, "pp_schedule": "interleaved", "virtual_stages": 2, "microbatches": 6},
     ["microbatches"], "value_error"),
    ({"zero_stage": 1, "dp_mode": "ps"}, ["zero_stage"], "value_error"),
    ({"dp": 6, "allreduce_algorithm": "butterfly"}, ["allreduce_algorithm"], "value_error"),
])
def test_whatif_errors_name_field_and_rule(patch, loc, typ):
    with pytest.raises(SpecError) as e:
        predict({**BASE, **patch})
    assert {"loc": loc, "type": typ} in [{"loc": x["loc"], "type": x["type"]}
                                         for x in e.value.errors]
    assert isinstance(e.value, ValueError)


def test_missing_required_fields():
    with pytest.raises(SpecError) as e:
        predict({"params": 10})
    missing = {x["loc"][0] for x in e.value.errors if x["type"] == "missing"}
    assert missing == {"dp", "tp", "pp", "zero_stage", "memory_model"}


def test_bad_spec_dict_is_a_spec_error():
    with pytest.raises(SpecError):
        predict({"parallel": {"dp": 3}})
    with pytest.raises(SpecError):
        predict(42)


# --- output shape --------------------------------------------------------------------------------

def test_required_keys_and_explain_figures():
    out = predict({**BASE, "bandwidth_GBps": 10, "compute_ms": 100, "pp": 2, "microbatches": 4,
                   "dp": 1})
    json.dumps(out)
    assert out["memory"]["per_rank_bytes"] > 0
    for k in ("params", "grads", "optimizer", "activations"):
        assert isinstance(out["memory"]["components"][k], float)
        f = out["memory"]["explain"][f"components.{k}"]
        assert set(f) == {"value", "unit", "formula", "inputs", "convention"}
    for key in ("bytes_per_rank", "time_lower_bound_s"):
        assert out["comm"]["explain"][key]["value"] == out["comm"][key]
    for key in ("speedup_no_overlap", "speedup_full_overlap"):
        assert out["step"]["explain"][key]["value"] == out["step"][key]
    assert out["pipeline"]["explain"]["bubble_fraction"]["value"] == \
        out["pipeline"]["bubble_fraction"] == pytest.approx(1 / 5)
    assert "16Ψ" in out["memory"]["explain"]["per_rank_bytes"]["convention"]
    assert set(out["conventions"]) == {"memory_model", "bubble", "comm", "units"}


def test_missing_bandwidth_gives_none_not_zero():
    out = predict(BASE)
    assert out["comm"]["time_lower_bound_s"] is None
    assert out["step"]["speedup_no_overlap"] is None
    assert "bandwidth_GBps" in out["step"]["explain"]["note"]


def test_zero3_memory_and_comm_together():
    out = predict({**BASE, "dp": 8, "zero_stage": 3})
    assert out["memory"]["per_rank_bytes"] == 16 * B / 8
    assert out["comm"]["bytes_per_rank"] == pytest.approx(3 * 7 / 8 * 2 * B)
    assert out["comm"]["dp_by_zero_stage"]["3"] == pytest.approx(
        1.5 * out["comm"]["dp_by_zero_stage"]["0"])


def test_fp32_memory_model():
    c = predict({**BASE, "dp": 1, "memory_model": "fp32"})["memory"]["components"]
    assert (c["params"], c["grads"], c["optimizer"]) == (4 * B, 4 * B, 8 * B)


def test_tp_pp_divide_model_state_in_whatif():
    one = predict({**BASE, "dp": 1})["memory"]["model_state_bytes"]
    split = predict({**BASE, "dp": 1, "tp": 2, "pp": 4, "microbatches": 4})
    assert split["memory"]["model_state_bytes"] == pytest.approx(one / 8)


def test_non_ring_allreduce_algorithm():
    out = predict({**BASE, "dp": 8, "allreduce_algorithm": "naive"})
    assert out["comm"]["bytes_per_rank"] == 7 * 2 * B


def test_zero_bubble_whatif_uses_simulator():
    out = predict({**BASE, "dp": 1, "pp": 4, "microbatches": 8, "pp_schedule": "zero-bubble"})
    sim = simulate("zero-bubble", 4, 8)
    assert out["pipeline"]["bubble_fraction"] == pytest.approx(sim["bubble_fraction"])
    assert out["pipeline"]["bubble_fraction"] < 3 / 11  # below 1F1B's


ZBV = {**BASE, "dp": 1, "pp": 4, "microbatches": 8, "pp_schedule": "zbv", "virtual_stages": 2}


def test_zbv_whatif_uses_simulator():
    out = predict(ZBV)
    sim = simulate("zbv", 4, 8, 2)
    assert out["pipeline"]["bubble_fraction"] == pytest.approx(sim["bubble_fraction"])
    assert out["pipeline"]["source"] == "schedule simulator (jobs/schedules.py)"
    assert "ZB-V" in out["pipeline"]["explain"]["bubble_fraction"]["formula"]
    zb = predict({**ZBV, "pp_schedule": "zero-bubble", "virtual_stages": 1})
    assert out["pipeline"]["bubble_fraction"] < zb["pipeline"]["bubble_fraction"]


def test_zbv_too_large_to_simulate_extrapolates_from_2p_minus_1(monkeypatch):
    import importlib
    P = importlib.import_module("jobs.theory.predict")  # the module, not the function
    kw = {**ZBV, "microbatches": 40, "t_f": 1.0, "t_b_input": 2.0, "t_b_weight": 0.5}
    full = predict(kw)["pipeline"]
    monkeypatch.setattr(P, "MAX_SIM_ACTIONS", 4 * 7 * 2 * 3)  # only m = 2p-1 = 7 fits
    ext = predict(kw)["pipeline"]
    assert "extrapolated" in ext["source"] and ext["simulation"] is None
    assert ext["bubble_fraction_total"] == pytest.approx(full["bubble_fraction_total"])
    assert ext["bubble_fraction_ideal"] == pytest.approx(full["bubble_fraction_ideal"])


def test_zbv_whatif_needs_two_virtual_stages():
    with pytest.raises(SpecError) as e:
        predict({**ZBV, "virtual_stages": 1})
    assert [x["loc"] for x in e.value.errors] == [["virtual_stages"]]


def test_zbv_stage_params_follow_the_v():
    # V placement at p = 2: rank 0 holds stages 0 (embeddings) and 3 (head), rank 1 two blocks
    h = 16
    m = {"arch": "gpt", "layers": 4, "hidden": h, "vocab": 50, "seq_len": 8}
    v = stage_params(m, 2, 2, 1, "v")
    assert sum(v) == param_count(m)
    assert v[1] == 2 * (12 * h * h + 12 * h)
    assert v != stage_params(m, 2, 2, 1)
    spec = parse_spec({"preset": "pp-zbv", "model": m})
    assert predict(spec)["params"]["per_pipeline_rank"] == v


def test_activation_memory_gpipe_vs_1f1b():
    dims = {"arch": "gpt", "layers": 8, "hidden": 64, "heads": 4, "seq_len": 32,
            "micro_batch_size": 2}
    kw = {**BASE, **dims, "dp": 1, "pp": 4, "microbatches": 16}
    g = predict({**kw, "pp_schedule": "gpipe"})["memory"]["components"]["activations"]
    f = predict({**kw, "pp_schedule": "1f1b"})["memory"]["components"]["activations"]
    assert g / f == pytest.approx(16 / 4)  # seed 000: in flight m vs p


# --- JobSpec path --------------------------------------------------------------------------------

def test_param_count_mlp_gpt_timed():
    assert param_count({"arch": "mlp", "layers": 2, "hidden": 3}) == 2 * (9 + 3)
    assert param_count({"arch": "timed", "layers": 2, "hidden": 3}) == 2 * 12
    h, L, V, S = 8, 2, 10, 5
    assert param_count({"arch": "gpt", "layers": L, "hidden": h, "vocab": V, "seq_len": S}) == \
        V * h + S * h + L * (12 * h * h + 12 * h) + 2 * h + h * V


def test_stage_params_sum_to_total():
    m = {"arch": "gpt", "layers": 4, "hidden": 16, "vocab": 50, "seq_len": 8}
    assert sum(stage_params(m, 2, 2, 1)) == param_count(m)
    assert sum(stage_params({"arch": "mlp", "layers": 4, "hidden": 8}, 4, 1, 1)) == \
        param_count({"arch": "mlp", "layers": 4, "hidden": 8})
    # TP: sharded matrices halve, LayerNorms / row biases / embeddings / head stay
    h = 16
    one, two = stage_params(m, 1, 1, 1)[0], stage_params(m, 1, 1, 2)[0]
    assert one - two == 4 * (12 * h * h + 6 * h) // 2


@pytest.mark.parametrize("preset", [p for p in PRESETS if p != "collective-sweep"])
def test_every_preset_predicts(preset):
    spec = parse_spec({"preset": preset})
    out = predict(spec)
    json.dumps(out)
    assert out["kind"] == "spec"
    assert out["memory"]["per_rank_bytes"] > out["memory"]["model_state_bytes"] > 0
    assert predict({"preset": preset})["memory"]["per_rank_bytes"] == \
        out["memory"]["per_rank_bytes"]


def test_spec_memory_model_from_precision():
    s = parse_spec({"preset": "zero2", "train": {"precision": "bf16", "fp32_grads": True}})
    assert predict(s)["memory"]["memory_model"] == "20psi"
    assert predict(parse_spec({"preset": "zero2", "train": {"precision": "bf16"}})
                   )["memory"]["memory_model"] == "16psi"
    assert predict(parse_spec({"preset": "zero2"}))["memory"]["memory_model"] == "fp32"


def test_spec_zero_stage_and_overrides():
    spec = parse_spec({"preset": "zero3", "model": {"hidden": 256, "layers": 8}})
    n = param_count(spec.model)
    out = predict(spec, bandwidth_GBps=10.0, compute_ms=50.0)
    assert out["memory"]["components"]["params"] == 4 * n / 2
    assert out["comm"]["bytes_per_rank"] == pytest.approx(3 * 1 / 2 * 4 * n)
    comm_s = 3 * 1 / 2 * 4 * n / 10e9  # the bytes above at 10 GB/s
    assert out["step"]["speedup_no_overlap"] == pytest.approx(0.05 / (0.05 / 2 + comm_s))
    with pytest.raises(SpecError):
        predict(spec, bandwidth_GBps=-1)


def test_timed_pipeline_spec_uses_layer_times():
    spec = parse_spec({"preset": "pp-1f1b", "model": {
        "arch": "timed", "layers": 4, "t_forward": 0.01, "t_backward_input": 0.02,
        "t_backward_weight": 0.01}})
    out = predict(spec)
    sim = out["pipeline"]["simulation"]
    assert sim["times"] == {"t_f": 0.02, "t_b_input": 0.04, "t_b_weight": 0.02}
    assert sim["makespan_s"] == pytest.approx((4 + 1) * 0.08)
    assert out["step"]["pipeline_compute_s"] == pytest.approx(sim["makespan_s"])


def test_gate_uses_busiest_pipeline_rank():
    spec = parse_spec({"preset": "pp-1f1b", "model": {"arch": "gpt", "vocab": 5000}})
    out = predict(spec)
    per = out["params"]["per_pipeline_rank"]
    # embeddings (vocab+seq_len)*h on stage 0 outweigh the head 2h + h*vocab on the last
    assert out["params"]["per_rank"] == max(per) == per[0] > per[1]


# --- inconsistent seed examples, corrected (docs/conventions.md) ---------------------------------

def test_inconsistent_examples_corrected():
    # seed 000: "GPT-3 (175B, 64 GPUs)：... ZeRO-1 = 750 GB，ZeRO-2 = 481 GB" under its own
    # 4M + 12M/N and 2M + 14M/N: 732.8 GB and 388.3 GB (20Ψ would give 743.75 and 399.2)
    z = predict({**BASE, "params": 175 * B, "dp": 64})["memory"]["by_zero_stage"]
    assert z["1"] / GB == pytest.approx(732.8125) != 750
    assert z["2"] / GB == pytest.approx(388.28125) != 481
    z20 = predict({**BASE, "params": 175 * B, "dp": 64, "memory_model": "20psi"}
                  )["memory"]["by_zero_stage"]
    assert z20["1"] / GB == pytest.approx(743.75) and z20["2"] / GB == pytest.approx(399.21875)
    # seed 000: "800 GPU = 64 数据并行副本 × 2 张量并行 × 4 流水线阶段" -> 512 devices
    assert predict({**BASE, "dp": 64, "tp": 2, "pp": 4})["step"]["devices"] == 512
    # seed 002: "4个GPU, 4个微批次: 气泡率 = 3/6 = 50%" with its (P-1)/(P-1+M) -> 3/7
    b = predict({**BASE, "dp": 1, "pp": 4, "microbatches": 4})["pipeline"]["bubble_fraction"]
    assert b == pytest.approx(3 / 7) != 0.5
    # seed 002's GPipe Gantt (p=4, m=4, 1 s each) ends at 11 s; dependencies give 14 s
    assert simulate("gpipe", 4, 4, 1, 1.0, 1.0, 0.0)["makespan_s"] == 14
    # seed 000 butterfly: "交换 M/2 个参数" per iteration contradicts its own total N*M*log2 N;
    # the table (M per worker per iteration) is kept
    row = {r["algorithm"]: r for r in allreduce_algorithms(8, 1.0)}["butterfly"]
    assert row["max_per_worker"] == 3 and row["total_volume"] == 24
    # seed 002 ZeRO savings "4x / 8x" hold only as N -> inf; at N = 64 (16Ψ): 3.82x and 7.21x
    assert 16 / sum(model_state_bytes(1, 64, 1).values()) == pytest.approx(3.82, abs=0.005)
    assert 16 / sum(model_state_bytes(1, 64, 2).values()) == pytest.approx(7.21, abs=0.005)


def test_collective_sweep_spec_memory_is_its_buffers():
    out = predict({"preset": "collective-sweep", "collective": {"max_bytes": 1 << 20}})
    assert out["kind"] == "collective_bench"
    assert out["memory"]["per_rank_bytes"] == 3 * (1 << 20)  # builtin: no scratch
    out = predict({"preset": "collective-sweep", "runtime": {"nproc_per_node": 4},
                   "collective": {"max_bytes": 1 << 20, "algorithms": ["ring", "naive"]}})
    assert out["memory"]["per_rank_bytes"] == (3 + 4) * (1 << 20)  # naive: N*S of scratch
    json.dumps(out)


def test_stage_times_drive_the_simulator():
    spec = parse_spec({"preset": "pp-interleaved", "model": {
        "arch": "timed", "layers": 8, "t_forward": 0.001, "t_backward_input": 0.002,
        "t_backward_weight": 0.001}})
    t = stage_times(spec)
    assert t == pytest.approx({"t_f": 0.002, "t_b_input": 0.004, "t_b_weight": 0.002})
    p = spec.parallel
    sim = simulate(p.pp_schedule, p.pp, p.microbatches, p.virtual_stages, **t)
    assert sim["bubble_fraction"] == pytest.approx(
        predict(spec)["pipeline"]["bubble_fraction_total"])
    assert stage_times(parse_spec({"preset": "pp-1f1b"})) is None


@pytest.mark.timeout(60)  # generous: the work must grow with the actions, not with p squared
@pytest.mark.parametrize("sched,m", [("1f1b", 1), ("1f1b", 6), ("zero-bubble", 6)])
def test_a_deep_pipeline_what_if_is_simulated_in_bounded_work(sched, m):
    # p = 10,000 stages: the simulator's sweeps and the 1F1B action lists were O(p^2) (an
    # API what-if with pp = 10^4 did not answer in 300 s); the bubble must still be exact.
    p = 10_000
    out = predict({"params": 7.5e9, "dp": 1, "tp": 1, "pp": p, "zero_stage": 0,
                   "memory_model": "16psi", "microbatches": m, "pp_schedule": sched})
    pipe = out["pipeline"]
    assert pipe["source"].startswith("schedule simulator")
    if sched == "1f1b":
        assert pipe["bubble_fraction_total"] == pytest.approx((p - 1) / (m + p - 1), rel=1e-9)
    else:  # the zero-bubble schedule is never worse than 1F1B's closed form
        assert 0 < pipe["bubble_fraction_total"] <= (p - 1) / (m + p - 1) + 1e-9
