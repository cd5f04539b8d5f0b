"""The RNG restore of a resume (issue 43, miss 7; docs/checkpoints.md): with `model.dropout`
the GPT draws a dropout mask from each rank's global RNG every forward, so a resumed run
equals the uninterrupted one only if the checkpoint's RNG state is restored. The oracle is
the uninterrupted run: interrupted at step AT, resumed to STEPS, every loss of the resumed
steps equals the full run's (fp32, 1e-6), under DDP and Megatron TP (two ranks, one launch).
That the masks do change the curve (dropout on vs off) is checked too, so the equality is not
one of a model that draws nothing."""

from __future__ import annotations

import pytest
import torch

from jobs.models import gpt
from jobs.spec import ModelSpec, SpecError, parse_spec
from tests.ckpt.helpers import AT, GPT, STEPS, TOL, launch, loss_gap, spec_of, summary, trio

DROP = {**GPT, "dropout": 0.1}
LAYOUTS = {"ddp": spec_of("ddp", model=DROP), "tp": spec_of("tp", model=DROP)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    specs = []
    for name, spec in LAYOUTS.items():
        specs += trio(f"drop-{name}", spec)
    specs.append(["nodrop-ddp-full", spec_of("ddp", model=GPT), None, {}])
    return launch(2, specs, tmp_path_factory.mktemp("rng"))


@pytest.mark.parametrize("name", LAYOUTS)
def test_resumed_with_dropout_equals_uninterrupted(runs, name):
    full, res = summary(runs, f"drop-{name}-full"), summary(runs, f"drop-{name}-resumed")
    assert res["start_step"] == res["resumed_from"] == AT
    assert len(full["loss"]) == STEPS and len(res["loss"]) == STEPS - AT
    assert loss_gap(full["loss"], res["loss"], AT) <= TOL
    # saving the checkpoint leaves the saving run's own stream alone: its step after the save
    # (it runs AT + 1 steps) equals the full run's too
    short = summary(runs, f"drop-{name}-short")
    assert loss_gap(full["loss"][:AT + 1], short["loss"], 0) <= TOL


def test_dropout_changes_the_curve(runs):
    """Same seed, data and initial parameters: only the masks differ (step 0 already)."""
    on, off = summary(runs, "drop-ddp-full")["loss"], summary(runs, "nodrop-ddp-full")["loss"]
    assert min(abs(a - b) for a, b in zip(on, off, strict=True)) > 100 * TOL


def test_dropout_module_and_its_draws():
    """p = 0 builds the very same model (no submodule, same parameters); p > 0 draws a new
    mask each training forward from the global RNG, and none in eval mode."""
    plain, drop = ModelSpec(**GPT), ModelSpec(**GPT, dropout=0.5)
    a, b = gpt.build(plain, 0), gpt.build(drop, 0)
    assert a.embed.drop is None and isinstance(b.embed.drop, torch.nn.Dropout)
    assert list(a.state_dict()) == list(b.state_dict())
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(),
                                                 b.state_dict().values(), strict=True))
    idx = torch.zeros(2, GPT["seq_len"], dtype=torch.long)
    torch.manual_seed(1)
    first = b(idx)
    torch.manual_seed(1)
    assert torch.equal(b(idx), first)  # the same RNG state, the same mask
    assert not torch.equal(b(idx), first)  # the stream moved on: another mask
    b.eval()
    assert torch.equal(b(idx), a.eval()(idx))  # no mask outside training


@pytest.mark.parametrize("model,parallel,fragment", [
    ({**GPT, "dropout": 1.0}, {"dp": 1}, "must be < 1"),
    ({**GPT, "dropout": -0.1}, {"dp": 1}, "must be >= 0"),
    ({"arch": "mlp", "dropout": 0.1}, {"dp": 1}, "needs arch 'gpt'"),
    ({**GPT, "dropout": 0.1}, {"dp": 2, "cp": 2}, "context parallelism"),
])
def test_dropout_spec_refused(model, parallel, fragment):
    body = {"model": model, "parallel": parallel,
            "runtime": {"nproc_per_node": parallel["dp"]}}
    with pytest.raises(SpecError) as e:
        parse_spec(body)
    errs = [x for x in e.value.errors if x["loc"][-1] == "dropout"]
    assert errs and fragment in errs[0]["msg"], e.value.errors


def test_dropout_spec_accepted():
    one = {"parallel": {"dp": 1}, "runtime": {"nproc_per_node": 1}}
    assert parse_spec({"model": {**GPT, "dropout": 0.5}, **one}).model.dropout == 0.5
    assert parse_spec({"model": {**GPT}, **one}).model.dropout == 0.0
