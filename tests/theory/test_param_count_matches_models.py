"""The theory's parameter counts are the real models' counts, exactly (the memory and traffic
predictions start from them)."""

import pytest

from jobs.models import model_module
from jobs.spec import parse_spec
from jobs.theory import param_count


@pytest.mark.parametrize("model", [
    {"arch": "mlp", "layers": 3, "hidden": 16},
    {"arch": "timed", "layers": 4, "hidden": 8},
    {"arch": "gpt", "layers": 2, "hidden": 32, "heads": 4, "seq_len": 8, "vocab": 50},
])
def test_param_count_equals_the_model(model):
    spec = parse_spec({"model": model, "runtime": {"nproc_per_node": 1}})
    built = model_module(spec.model.arch).build(spec.model, 0)
    assert param_count(spec.model) == sum(p.numel() for p in built.parameters())
