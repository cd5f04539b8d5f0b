"""Rules written once (jobs.strategies, JobSpec.tokens_per_step, ParallelDims.groups), checked
against tables and layouts written by hand here, through every reader of each rule."""

import types

import pytest

from jobs import compose, faults
from jobs.analysis import predicted, steps
from jobs.dims import ParallelDims
from jobs.parallel import formulas
from jobs.spec import AVAILABLE, PRESETS, parse_spec
from jobs.theory.memory import memory_model_of_spec

# preset -> (DP family compose builds, ZeRO stage, parameter server), by hand from the seeds
HAND = {
    "dp-ps": ("ps", 0, True),
    "dp-allreduce": ("allreduce", 0, False),
    "ddp": ("ddp", 0, False),
    "zero1": ("zero1", 1, False),
    "zero2": ("zero2", 2, False),
    "zero3": ("zero3", 3, False),
    "fsdp": ("zero3", 3, False),
}


@pytest.mark.parametrize("name", sorted(HAND))
def test_each_dp_preset_reads_one_row(name):
    family, stage, ps = HAND[name]
    spec = parse_spec({"preset": name})
    assert spec.strategy == name and name in AVAILABLE
    ctx = types.SimpleNamespace(spec=spec, dims=ParallelDims.from_spec(spec, 2))
    assert compose.dp_family(ctx) == family
    assert formulas.ZERO_STAGE[name] == stage
    # fp32 presets: 4 + 4 + 8 bytes per parameter, ZeRO-sharded over dp = 2 (Ψ = 10)
    want = {"params": 40 / (2 if stage == 3 else 1), "grads": 40 / (2 if stage >= 2 else 1),
            "optimizer": 80 / (2 if stage >= 1 else 1)}
    assert formulas.model_state(name, 2, 10, rank=0) == want
    # a parameter-server worker holds no optimizer state; everyone else as rank 0
    assert formulas.model_state(name, 2, 10, rank=1) == {**want, "optimizer": 0 if ps else
                                                         want["optimizer"]}
    pred = {"params": {"per_rank": 10}, "memory": {"memory_model": "fp32"}}
    assert predicted.rank_model_state(pred, spec, 0, dp_coord=1)["optimizer"] == \
        (0 if ps else want["optimizer"])
    assert predicted.rank_model_state(pred, spec, 0, dp_coord=0)["optimizer"] == \
        want["optimizer"]


def test_dp_one_is_single_and_labels_outside_the_table():
    spec = parse_spec({"preset": "ddp", "parallel": {"dp": 1}, "runtime": {"nproc_per_node": 1}})
    assert spec.strategy == "single"
    ctx = types.SimpleNamespace(spec=spec, dims=ParallelDims.from_spec(spec, 1))
    assert compose.dp_family(ctx) == "single"
    assert set(formulas.ZERO_STAGE) == set(HAND)


@pytest.mark.parametrize("precision,fp32_grads,want", [
    ("fp32", False, "fp32"), ("fp32", True, "fp32"), ("bf16", False, "16psi"),
    ("bf16", True, "20psi")])
def test_memory_model_of_a_precision(precision, fp32_grads, want):
    spec = types.SimpleNamespace(train=types.SimpleNamespace(precision=precision,
                                                             fp32_grads=fp32_grads))
    assert memory_model_of_spec(spec) == want
    # ddp over 2 ranks holds everything: 16 / 20 / 16 bytes per parameter (Ψ = 10)
    total = sum(formulas.model_state("ddp", 2, 10, precision, fp32_grads).values())
    assert total == {"fp32": 160, "16psi": 160, "20psi": 200}[want]


def test_tokens_per_step_by_hand():
    one = {"train": {"global_batch": 6}, "runtime": {"nproc_per_node": 1}}
    gpt = parse_spec({"model": {"arch": "gpt", "seq_len": 32}, **one})
    mlp = parse_spec({"model": {"arch": "mlp", "seq_len": 32}, **one})
    timed = parse_spec({"model": {"arch": "timed", "seq_len": 32}, **one})
    assert gpt.tokens_per_step == 192 and mlp.tokens_per_step == 6
    assert timed.tokens_per_step == 6  # a timed sample is one token, as an MLP's
    assert steps.tokens_per_step(timed.to_dict()) == 6
    assert steps.tokens_per_step(gpt.to_dict()) == 192
    assert steps.tokens_per_step(mlp.to_dict()) == 6
    assert steps.tokens_per_step({"kind": "compute_bench", **one}) is None
    assert steps.tokens_per_step(None) is None


# dp=2, tp=2, pp=2 (rank = (pp*dp + dp_idx)*tp + tp_idx), written out by hand
GROUPS_3D = {
    "tp": [[0, 1], [2, 3], [4, 5], [6, 7]],
    "dp": [[0, 2], [1, 3], [4, 6], [5, 7]],
    "pp": [[0, 4], [1, 5], [2, 6], [3, 7]],
}


@pytest.mark.parametrize("axis", sorted(GROUPS_3D))
def test_mesh_groups_by_hand(axis):
    dims = ParallelDims(dp=2, tp=2, pp=2, world_size=8)
    assert dims.groups(axis) == GROUPS_3D[axis]
    for r in range(8):
        mine = [g for g in GROUPS_3D[axis] if r in g]
        assert dims.group_ranks(axis, r) == mine[0]
        assert faults.group_ranks(dims, r, 8)[axis] == mine[0]


def test_faults_group_ranks_every_axis_by_hand():
    dims = ParallelDims(dp=2, tp=2, pp=2, world_size=8)
    assert faults.group_ranks(dims, 5, 8) == {"pp": [1, 5], "dp": [5, 7], "tp": [4, 5]}


def test_cp_groups_by_hand():
    # dp=4 with tp=2: DP groups [0,2,4,6] and [1,3,5,7]; cp=2 takes consecutive DP ranks
    dims = ParallelDims(dp=4, tp=2, pp=1, world_size=8, cp=2)
    assert dims.groups("cp") == [[0, 2], [4, 6], [1, 3], [5, 7]]
    assert dims.group_ranks("cp", 4) == [4, 6]
    cp4 = ParallelDims(dp=4, tp=1, pp=1, world_size=4, cp=4)
    assert cp4.groups("cp") == [[0, 1, 2, 3]]


def test_ep_and_expert_dp_groups_by_hand():
    # dp=4, ep=2 on 4 ranks: EP splits [0,1] / [2,3], expert-DP pairs equal EP ranks
    dims = ParallelDims(dp=4, tp=1, pp=1, world_size=4, ep=2)
    assert dims.groups("ep") == [[0, 1], [2, 3]]
    assert dims.groups("edp") == [[0, 2], [1, 3]]
    # with tp=2 and pp=2 (the 4d-moe preset's layout): per DP group [0,2], [1,3], [4,6], [5,7]
    four_d = ParallelDims.from_spec(parse_spec({"preset": "4d-moe"}), 8)
    assert four_d.groups("ep") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert four_d.groups("edp") == [[0], [2], [1], [3], [4], [6], [5], [7]]


def test_sub_axis_degrees_must_divide_dp():
    with pytest.raises(ValueError, match="dividing dp"):
        ParallelDims(dp=4, tp=1, pp=1, world_size=4, cp=3)
    with pytest.raises(ValueError, match="axis must be"):
        ParallelDims(dp=2, tp=1, pp=1, world_size=2).groups("xp")


def test_every_preset_strategy_is_unchanged():
    """Labels of every preset, written out by hand (spec.derive_strategy reads the table)."""
    want = {"dp-ps": "dp-ps", "fsdp": "fsdp", "zero3": "zero3", "3d": "3d", "cp": "cp",
            "moe-ep": "ddp+moe-ep", "4d-moe": "3d+moe-ep", "cp-3d": "tp+pp-1f1b+cp",
            "tp": "tp", "sp": "sp"}
    assert {n: parse_spec({"preset": n}).strategy for n in want} == want
    assert all(parse_spec({"preset": n}).strategy in AVAILABLE for n in PRESETS)
