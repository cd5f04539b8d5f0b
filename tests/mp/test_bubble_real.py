"""Bubbles on real compute (issue #4): p = 2, stages of equal cost, the measured idle fraction
of every stage within 5 points of the closed form (p-1)/(v*m+p-1) for GPipe, 1F1B and
interleaved 1F1B.

Two ranks on two cores each own a core, so wall-clock bubbles are meaningful here (the exact,
core-count-independent checks at p = 2 and 4 are test_pipeline.py's, on the `timed` model). The
stages do equal matrix work: an MLP of 32 identical 768 x 768 layers split 16 / 16 (8 per chunk
interleaved), micro-batches of 128 rows, about 25 ms of forward per stage, with the input batch
requiring a gradient so the first stage's backward is as long as the others' (see
bubble_real_worker.py). What is not equal is small next to that: the last stage's loss and a gloo
send of 384 KiB per boundary and action. A busy machine only ever adds delay, so the least
disturbed step (shortest window) of 7 is compared, as a benchmark takes its fastest run.
With another test run loading the machine: within 4.5 points (quiet: docs/model-parallel.md).
"""

from __future__ import annotations

import json

import pytest
from _launch import torchrun

from jobs import bubbles, schedules

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

P, HIDDEN, LAYERS, MB, STEPS = 2, 768, 32, 128, 8
TOL = 0.05


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bubble_real")
    torchrun("bubble_real_worker.py", P, out, str(HIDDEN), str(LAYERS), str(MB), str(STEPS))
    return out, json.loads((out / "result.json").read_text())["cases"]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved"])
def test_real_compute_bubble_matches_closed_form(run, schedule):
    out, cases = run
    m, v = cases[schedule]["m"], cases[schedule]["v"]
    b = bubbles.stage_bubbles(bubbles.load(out / schedule), steps=list(range(1, STEPS)))
    step = min(b["steps"], key=lambda k: b["steps"][k]["window_s"])
    closed = schedules.closed_form_bubble(schedule, P, m, v)
    measured = {pp: st["idle_fraction"] for pp, st in b["steps"][step]["stages"].items()}
    print(schedule, "closed form", round(closed, 4), "measured", measured, "step", step)
    assert set(measured) == set(range(P))
    for pp, idle in measured.items():
        assert abs(idle - closed) <= TOL, (schedule, pp, idle, closed)
