"""Measured pipeline partition (parallel.pp_partition = measured): per-layer costs, then the
contiguous split that minimises the most expensive stage. Measured times are never compared
here (they depend on the machine's load): the split is checked on given costs, the measurement
on its shape and side effects."""

from __future__ import annotations

import pytest
import torch

from jobs.models import gpt, mlp
from jobs.parallel.pipeline.stage import measure_layer_costs, partition_by_cost, split_stages
from jobs.spec import ModelSpec


def test_heavy_head_gets_fewer_layers():
    # the LM head (and its loss) counted with the last block costs several blocks
    ms = ModelSpec(arch="gpt", layers=8, hidden=32, heads=2, seq_len=16, vocab=4096)
    model = gpt.build(ms, 0)
    x, y = gpt.batch(ms, 8, 0, 0)
    measured = measure_layer_costs(model, x, y, gpt.loss_fn, reps=1)
    assert len(measured) == 8 and all(c > 0 for c in measured)
    costs = [1.0] * 7 + [5.0]
    sizes = partition_by_cost(costs, 2)
    assert sizes == [6, 2]  # max(6, 1 + 5) = 6: the least the most expensive stage can cost
    assert all(p.grad is None for p in model.parameters())  # measuring leaves no gradients
    stages = split_stages(model, 2, 1, 1, sizes=sizes)
    assert len(stages[0].blocks) == sizes[1] and stages[0].head is not None


def test_mlp_without_embed_or_head():
    ms = ModelSpec(arch="mlp", layers=4, hidden=64)
    model = mlp.build(ms, 0)
    x, y = mlp.batch(ms, 32, 0, 0)
    costs = measure_layer_costs(model, x, y, mlp.loss_fn, reps=1)
    assert len(costs) == 4 and all(c > 0 for c in costs)


def test_model_without_layers_is_refused():
    with pytest.raises(ValueError, match="no blocks/layers"):
        measure_layer_costs(torch.nn.Linear(2, 2), torch.zeros(1, 2), torch.zeros(1, 2),
                            torch.nn.functional.mse_loss)
