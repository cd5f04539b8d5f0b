"""A check must be able to fail (issue 12): with a gradient-scale bug planted through the
test-only hook (jobs/testbug.py), the correctness gate's comparison fails for every strategy
the bug touches. Two small launches (world size 2), one per bug."""

from __future__ import annotations

import pytest
import torch

from jobs.spec import parse_spec
from tests.support.gate import TOL, assemble, reference, rel_err
from tests.support.launch import multirun

GPT = {"arch": "gpt", "layers": 2, "hidden": 16, "heads": 4, "seq_len": 8, "vocab": 32}


def spec(par: dict, train: dict | None = None, model: dict | None = None) -> dict:
    return {"model": model or {"arch": "mlp", "hidden": 16, "layers": 2},
            "parallel": par, "runtime": {"nproc_per_node": 2},
            "train": {"steps": 1, "global_batch": 8, "optimizer": "sgd", "lr": 0.1,
                      **(train or {})}}


BUGS = {
    "drop_dp_average": [
        ("ddp", spec({"dp": 2})), ("ps", spec({"dp": 2, "dp_mode": "ps"})),
        ("allreduce", spec({"dp": 2, "dp_mode": "allreduce"})),
        ("zero1", spec({"dp": 2, "zero_stage": 1})), ("zero2", spec({"dp": 2, "zero_stage": 2})),
        ("zero3", spec({"dp": 2, "zero_stage": 3})),
        ("native-ddp", spec({"dp": 2, "engine": "native"})),
        ("native-zero1", spec({"dp": 2, "zero_stage": 1, "engine": "native"})),
        ("native-zero3", spec({"dp": 2, "zero_stage": 3, "engine": "native"}))],
    "drop_mb_average": [
        ("accum-ddp", spec({"dp": 2}, {"grad_accum": 2})),
        ("accum-zero3", spec({"dp": 2, "zero_stage": 3}, {"grad_accum": 2})),
        ("pp-1f1b", spec({"pp": 2, "microbatches": 4})),
        ("native-pp-1f1b", spec({"pp": 2, "microbatches": 4, "engine": "native"})),
        ("tp-accum", spec({"tp": 2}, {"grad_accum": 2}, GPT))],
}


@pytest.mark.parametrize("bug", list(BUGS))
def test_injected_bug_fails_the_gate(bug, tmp_path):
    runs = BUGS[bug]
    multirun(2, runs, tmp_path, env={"PARALAB_TEST_BUG": bug})
    for name, s in runs:
        ref = reference(parse_spec(s, max_world_size=1 << 30))
        run = tmp_path / name
        got = (torch.load(run / "grads-step0.pt") if (run / "grads-step0.pt").exists()
               else assemble(run, ref["grads"], "grads"))
        err = rel_err(got, ref["grads"])
        assert err > 100 * TOL, (bug, name, err)  # the gate (<= TOL) would fail
