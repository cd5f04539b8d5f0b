"""Presets through `python -m jobs.train` (torchrun, gloo): step-0 gradients and final parameters
after 2 steps vs a single-process run on the same global batches (the correctness gate,
tests/support/gate.py; Adam and SGD), and the summary's pipeline / bytes fields. Activation
checkpointing composed with TP, SP, PP (1F1B) and 3D on both engines is gated the same way."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from jobs.analysis import analyze_folder
from jobs.spec import parse_spec
from tests.support.gate import TOL, assemble, loss_err, reference, rel_err
from tests.support.launch import run_worker

# several torchrun launches (module fixtures), slower still on a loaded 2-core box
HERE = Path(__file__).parent

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

GPT = {"arch": "gpt", "layers": 4, "hidden": 16, "heads": 4, "seq_len": 8, "vocab": 32}
MLP = {"layers": 4, "hidden": 16}
CASES = {
    "tp": {"preset": "tp", "model": GPT},
    "sp": {"preset": "sp", "model": GPT},
    "pp-gpipe": {"preset": "pp-gpipe", "model": MLP},
    "pp-1f1b": {"preset": "pp-1f1b", "model": GPT},
    "pp-interleaved": {"preset": "pp-interleaved", "model": MLP},
    "pp-zb": {"preset": "pp-zb", "model": MLP},
    "pp-zbv": {"preset": "pp-zbv", "model": GPT},
    "3d": {"preset": "3d", "model": GPT},
    "ddp+sp": {"preset": "sp", "model": GPT, "parallel": {"dp": 2},
               "runtime": {"nproc_per_node": 4}},
}
DP4 = {"runtime": {"nproc_per_node": 4}}
CASES.update({
    "zero1+tp": {"preset": "tp", "model": GPT, "parallel": {"dp": 2, "zero_stage": 1}, **DP4},
    "zero2+tp": {"preset": "tp", "model": GPT, "parallel": {"dp": 2, "zero_stage": 2}, **DP4},
    "zero1+pp-1f1b": {"preset": "pp-1f1b", "model": GPT, "parallel": {"dp": 2, "zero_stage": 1},
                      **DP4},
    "dp-allreduce+pp-interleaved": {"preset": "pp-interleaved", "model": MLP,
                                    "parallel": {"dp": 2, "dp_mode": "allreduce"}, **DP4},
    "native-zero3+tp": {"preset": "tp", "model": GPT,
                        "parallel": {"dp": 2, "zero_stage": 3, "engine": "native"}, **DP4},
})
CASES["tp+vocab"] = {"preset": "tp", "model": GPT, "parallel": {"vocab_parallel": True}}
# 5 layers do not split evenly over 2 stages: the measured partition cuts them
CASES["pp-1f1b+measured"] = {"preset": "pp-1f1b", "model": {**GPT, "layers": 5, "vocab": 512},
                             "parallel": {"pp_partition": "measured"}}
NATIVE = {f"native-{k}": {**v, "parallel": {**v.get("parallel", {}), "engine": "native"}}
          for k, v in CASES.items() if k in ("tp", "sp", "pp-gpipe", "pp-1f1b", "pp-interleaved",
                                              "pp-zb", "pp-zbv", "3d", "tp+vocab",
                                              "pp-1f1b+measured")}
CASES["native-3d+sp+vocab"] = {"preset": "3d", "model": GPT, "parallel": {
    "engine": "native", "sequence_parallel": True, "vocab_parallel": True}}
CASES.update(NATIVE)
AC = {"train": {"activation_checkpointing": True}}
SGD = {"train": {"optimizer": "sgd", "lr": 0.1}}
for eng in ("reference", "native"):
    pre = "" if eng == "reference" else "native-"
    CASES[f"{pre}ac+tp"] = {"preset": "tp", "model": GPT, "parallel": {"engine": eng}, **AC}
    CASES[f"{pre}ac+sp"] = {"preset": "sp", "model": GPT, "parallel": {"engine": eng}, **AC}
    CASES[f"{pre}ac+pp-1f1b"] = {"preset": "pp-1f1b", "model": GPT, "parallel": {"engine": eng},
                                 **AC}
    CASES[f"{pre}ac+3d"] = {"preset": "3d", "model": GPT, "parallel": {"engine": eng}, **AC}
    CASES[f"{pre}sgd+3d"] = {"preset": "3d", "model": GPT, "parallel": {"engine": eng}, **SGD}
    CASES[f"{pre}sgd+pp-1f1b"] = {"preset": "pp-1f1b", "model": GPT,
                                  "parallel": {"engine": eng}, **SGD}
CASES["ac+pp-zb"] = {"preset": "pp-zb", "model": MLP, **AC}  # split backward: B, then W
CASES["native-ac+pp-interleaved"] = {"preset": "pp-interleaved", "model": MLP,
                                     "parallel": {"engine": "native"}, **AC}
CASES["sgd+tp+accum"] = {"preset": "tp", "model": GPT, "train": {
    "optimizer": "sgd", "lr": 0.1, "grad_accum": 2}}


def _spec(case: dict):
    return parse_spec({**case, "train": {"steps": 2, "global_batch": 8,
                                         **case.get("train", {})}})


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """All cases, grouped by world size: one torchrun launch per world size."""
    out = tmp_path_factory.mktemp("train_mp")
    by_world: dict = {}
    for name, case in CASES.items():
        s = _spec(case)
        (out / name).mkdir()
        (out / name / "spec.json").write_text(json.dumps(s.to_dict()))
        by_world.setdefault(s.world_size, []).append(name)
    os.environ["PARALAB_DUMP_PARAMS"] = "1"
    try:
        for world, names in by_world.items():
            res = run_worker(HERE / "train_worker.py", world, out, *names, timeout=600)
            assert res["done"] == names
    finally:
        os.environ.pop("PARALAB_DUMP_PARAMS")
    return out


def stage_peaks(summary: dict, key: str) -> list[int]:
    """Per pipeline stage (in order), the largest of its ranks' runtime peaks."""
    by: dict[int, int] = {}
    for r in summary["ranks"]:
        s = int(r["coords"].get("pp", 0))
        by[s] = max(by.get(s, 0), r["pipeline_peak"][key])
    return [by[s] for s in sorted(by)]


@pytest.mark.parametrize("name", list(CASES))
def test_preset_matches_single_process(name, runs):
    spec = _spec(CASES[name])
    out = runs / name
    ref = reference(spec)
    assert rel_err(assemble(out, ref["grads"], "grads"), ref["grads"]) <= TOL
    assert rel_err(assemble(out, ref["params"]), ref["params"]) <= TOL
    summary = json.loads((out / "summary.json").read_text())
    assert loss_err(summary["loss"], ref["loss"]) <= TOL
    assert summary["strategy"] == spec.strategy
    # the bubble per stage and the bytes per axis: the analysis of the traces (their one
    # home); the in-flight peaks: each rank's runtime's own count, in the summary
    analysis = analyze_folder(out)
    bubbles = {r["stage"]: r for r in analysis["tables"]["stage_bubbles"]}
    assert set(bubbles) == set(range(spec.parallel.pp))
    assert all(0 <= r["measured_idle_fraction"] < 1 for r in bubbles.values())
    for rank in summary["ranks"]:
        peak = rank["pipeline_peak"]
        assert peak["inflight_microbatches"] >= 1 and peak["activation_bytes"] > 0
        if spec.parallel.pp > 1 and spec.parallel.pp_schedule == "gpipe":  # m in flight
            assert peak["inflight_microbatches"] == spec.parallel.microbatches
        if spec.parallel.pp > 1 and spec.parallel.pp_schedule == "1f1b":  # at most p
            assert peak["inflight_microbatches"] <= spec.parallel.pp
    axes = {r["axis"] for r in analysis["tables"]["axis_bytes"] if r["bytes_sent"]}
    want = {a for a, n in (("tp", spec.parallel.tp), ("pp", spec.parallel.pp),
                           ("dp", spec.parallel.dp)) if n > 1}
    assert want <= axes
    # every byte is attributed to a mesh axis: nothing counted twice under a raw group name
    assert axes <= {"tp", "pp", "dp"}


def _tp_bytes_step0(out) -> float:
    total = 0.0
    for line in (out / "trace-rank0.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r.get("type") == "comm" and r.get("axis") == "tp" and r.get("step") == 0:
            total += r["payload_bytes"]
    return total


def test_native_vocab_parallel_moves_the_reference_bytes(runs):
    """DTensor's vocab-parallel embedding (masked lookup + all-reduce) and loss_parallel's
    cross-entropy (max, target logit, sum-exp all-reduces) move what Megatron's do."""
    ref, nat = _tp_bytes_step0(runs / "tp+vocab"), _tp_bytes_step0(runs / "native-tp+vocab")
    plain = _tp_bytes_step0(runs / "tp")
    assert ref > plain > 0  # vocab parallelism adds the embedding and loss all-reduces
    assert nat == ref


@pytest.mark.parametrize("name", ["pp-1f1b+measured", "native-pp-1f1b+measured"])
def test_measured_partition_is_reported(runs, name):
    part = json.loads((runs / name / "summary.json").read_text())["pipeline"]["partition"]
    assert part["mode"] == "measured"
    assert len(part["layer_costs_s"]) == 5 and all(c > 0 for c in part["layer_costs_s"])
    assert sum(part["layers_per_stage"]) == 5 and len(part["layers_per_stage"]) == 2
    even = json.loads((runs / "pp-1f1b" / "summary.json").read_text())["pipeline"]["partition"]
    assert even == {"mode": "even", "layers_per_stage": [2, 2]}


AC_PAIRS = [(f"{pre}{k}", f"{pre}ac+{k}") for pre in ("", "native-")
            for k in ("tp", "sp", "pp-1f1b", "3d")]


def _tp_bytes(out, step: int, recompute: bool) -> float:
    total = 0.0
    for line in (out / "trace-rank0.jsonl").read_text().splitlines():
        r = json.loads(line)
        if (r.get("type") == "comm" and r.get("axis") == "tp" and r.get("step") == step
                and bool(r.get("recompute")) == recompute):
            total += r["bytes_sent"]
    return total


@pytest.mark.parametrize("plain,ac", AC_PAIRS)
def test_checkpointing_memory_and_recompute_comm(runs, plain, ac):
    """Activation checkpointing, predicted (seed 004's activation formula and the recompute
    collectives, jobs/theory) and measured (peak bytes autograd keeps per stage; TP records
    flagged `recompute`): checkpointing lowers both memory figures, keeps at least the
    predicted block inputs, and its recomputed forward moves exactly the predicted bytes."""
    from jobs.theory import predict
    meas, pred = {}, {}
    for name in (plain, ac):
        summary = json.loads((runs / name / "summary.json").read_text())
        meas[name] = stage_peaks(summary, "activation_bytes")
        pred[name] = predict(_spec(CASES[name]))["memory"]["components"]["activations"]
    assert all(a < p for a, p in zip(meas[ac], meas[plain], strict=True)), meas
    assert 0 < pred[ac] < pred[plain] and max(meas[ac]) >= pred[ac], (meas, pred)
    spec = _spec(CASES[ac])
    rounds = spec.parallel.microbatches * spec.train.grad_accum
    want = predict(spec)["comm"]["per_microbatch"]["tp_recompute"] * rounds
    step = 0 if ac.startswith("native") else 1  # DTensor's collectives: recorded on step 0
    assert _tp_bytes(runs / ac, step, True) == want
    assert _tp_bytes(runs / plain, step, True) == 0
    assert (want > 0) == (spec.parallel.tp > 1)
