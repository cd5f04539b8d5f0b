"""Pipeline receive buffers (issue 38 item 4): the reference runtime keeps one receive per kind
(activations, output gradients) posted ahead, in the run's dtype; its measured peak of live
receive buffers equals a hand count from the schedule and jobs/theory/ranks.py's prediction,
exactly, on every schedule (and the schedules stay exact against a single process).

Hand count, p = 2, m = 4, 1F1B (one buffer = micro-batch 2 x h 16 x 4 bytes = 128):
  rank 0  F0 F1 BW0 F2 BW1 F3 BW2 BW3, receives the 4 output gradients. g0 is posted at the
          start (1 live); BW0 waits for g0 and posts g1 (g0 in use + g1 = 2); g0 is freed when
          BW0 ends (1); every BW repeats this: peak 2.
  rank 1  F0 BW0 F1 BW1 ..., receives the 4 activations: a0 posted at the start; F0's wait
          turns a0 into the stage input (an activation, no longer a receive buffer) and posts
          a1: never more than 1.
Before issue 38 every receive of a step was posted up front: 4 buffers on each rank.
p = 4, m = 4, 1F1B: ranks 0 and 3 as above (2, 1); rank 1 runs F0 F1 F2 BW0 F3 BW1 BW2 BW3
with a0 and g0 posted at the start: at BW0, a3 (posted at F2) + g0 + g1 = 3; rank 2 (F0 F1
BW0 ...) likewise 3 at BW0: [2, 3, 3, 1].
"""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.theory.ranks import pipeline_ranks
from tests.support.launch import run_worker

HERE = Path(__file__).parent
GB, H = 8, 16  # recv_worker.py: global batch, mlp hidden (4 layers)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module", params=[2, 4], ids=["p2", "p4"])
def runs(request, tmp_path_factory):
    p = request.param
    return p, run_worker(HERE / "recv_worker.py", p, tmp_path_factory.mktemp(f"recv{p}"))


def predicted(schedule: str, p: int, m: int, v: int, act_bytes: int) -> list[float]:
    w = {"arch": "mlp", "layers": 4, "hidden": H, "micro_batch_size": GB // m, "pp": p,
         "virtual_stages": v, "microbatches": m, "pp_schedule": schedule,
         "activation_checkpointing": False}
    return [r["recv_buffers"] for r in pipeline_ranks(w, act_bytes)]


def test_hand_count_1f1b_m4(runs):
    p, res = runs
    buf = (GB // 4) * H * 4
    want = {2: [2, 1], 4: [2, 3, 3, 1]}[p]
    assert [r["1f1b"]["recv_buffer_bytes"] for r in res["ranks"]] == [n * buf for n in want]
    # float64 training: the same buffers at 8 bytes an element (the dtype, not a fixed 4)
    assert [r["1f1b/float64"]["recv_buffer_bytes"] for r in res["ranks"]] == \
        [n * 2 * buf for n in want]
    assert {r["1f1b/float64"]["dtype"] for r in res["ranks"]} == {"torch.float64"}


def test_measured_equals_predicted_on_every_schedule(runs):
    p, res = runs
    names = list(res["ranks"][0])
    assert len(names) == (7 if p == 2 else 5)
    for name in names:
        info = res["ranks"][0][name]
        want = predicted(name.split("/")[0], p, info["m"], info["v"], info["elem_bytes"])
        got = [r[name]["recv_buffer_bytes"] for r in res["ranks"]]
        assert got == want, (name, got, want)
        assert all(g > 0 for g in got), name  # every rank receives something at p >= 2


def test_schedules_stay_exact(runs):
    _, res = runs
    for r in res["ranks"]:
        for name, info in r.items():
            assert info["err"] <= (1e-12 if "float64" in name else 1e-5), name
