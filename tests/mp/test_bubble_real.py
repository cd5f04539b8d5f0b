"""Bubbles on real compute (issue #4): p = 2, stages of equal cost, the measured idle fraction
of every stage within 5 points of the closed form (p-1)/(v*m+p-1) for GPipe, 1F1B and
interleaved 1F1B.

Two ranks on two cores each own a core, so wall-clock bubbles are meaningful here (the exact,
core-count-independent checks at p = 2 and 4 are test_pipeline.py's, on the `timed` model). The
stages do equal matrix work: an MLP of 32 identical 512 x 512 layers split 16 / 16 (8 per chunk
interleaved), micro-batches of 256 rows, about 20 ms of forward per stage, with the input batch
requiring a gradient so the first stage's backward is as long as the others' (see
bubble_real_worker.py). A 512 x 512 layer (1 MiB) stays in a core's 2 MiB L2; at 768 x 768 the
two ranks share L3 bandwidth, so a rank computes faster while the other idles and the stage
costs drift with the schedule's phase (the spread of the per-stage bubble doubled). What is not
equal is small next to that: the last stage's loss and a gloo send of 512 KiB per boundary and
action. Steps in which a rank lost its core while computing (its thread's CPU time falls below
its compute spans' wall time) are set aside; of the rest the shortest window is compared, as a
benchmark takes its fastest run; fewer than 3 such steps of 9 skip the test with the ratios
(docs/model-parallel.md has the figures).
"""

from __future__ import annotations

import json

import pytest
from _launch import torchrun

from jobs import bubbles, schedules

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

P, HIDDEN, LAYERS, MB, STEPS = 2, 512, 32, 256, 10
TOL = 0.05


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bubble_real")
    torchrun("bubble_real_worker.py", P, out, str(HIDDEN), str(LAYERS), str(MB), str(STEPS))
    return out, json.loads((out / "result.json").read_text())["cases"]


UNDISTURBED = 0.95  # a rank's CPU time over its busy span time in a step; ~0.6-0.75 when a
# third process shares the two cores, 0.97-1.01 when each rank owns one


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved"])
def test_real_compute_bubble_matches_closed_form(run, schedule):
    out, cases = run
    m, v, cpu = cases[schedule]["m"], cases[schedule]["v"], cases[schedule]["cpu_s"]
    b = bubbles.stage_bubbles(bubbles.load(out / schedule), steps=list(range(1, STEPS)))
    # The closed form assumes each rank computes at full speed: keep the steps in which no
    # rank lost its core while computing (its thread's CPU time covers its compute spans).
    ratios = {k: min(cpu[str(pp)][k] / st["busy_s"] for pp, st in b["steps"][k]["stages"].items())
              for k in b["steps"]}
    ok = [k for k, r in ratios.items() if r >= UNDISTURBED]
    if len(ok) < 3:
        pytest.skip(f"the ranks did not own a core each (CPU / busy per step: "
                    f"{[round(r, 2) for r in ratios.values()]}); a wall-clock bubble would "
                    "measure the host's contention")
    step = min(ok, key=lambda k: b["steps"][k]["window_s"])
    closed = schedules.closed_form_bubble(schedule, P, m, v)
    measured = {pp: st["idle_fraction"] for pp, st in b["steps"][step]["stages"].items()}
    print(schedule, "closed form", round(closed, 4), "measured", measured, "step", step,
          "undisturbed steps", len(ok))
    assert set(measured) == set(range(P))
    for pp, idle in measured.items():
        assert abs(idle - closed) <= TOL, (schedule, pp, idle, closed)
