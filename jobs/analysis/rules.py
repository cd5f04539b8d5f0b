"""The conventions every aggregate figure follows, defined once. The analysis applies them, its
JSON carries their wording (`analysis["rules"]`), and the run page shows that wording next to
the figures, so a reader always knows which steps a mean covers and what a flag means.
Standard library only.
"""

from __future__ import annotations

import statistics

# Step 0 carries one-off costs (allocator growth, gloo connection set-up, lazy optimizer state,
# DDP's bucket rebuild): aggregates leave it out when there is any later step.
WARMUP_STEPS = 1

# A straggler must have kept the others waiting for at least this share of the step (and longer
# than the clock-alignment error bound, below which "who arrived last" is noise).
STRAGGLER_MIN_WAIT_FRACTION = 0.05
# ... at this share of the steady steps at least, to be named for the whole run.
STRAGGLER_MIN_STEP_SHARE = 0.5

RULES = {
    "steady_steps": f"aggregates cover steps >= {WARMUP_STEPS} (step 0 is warm-up: allocator, "
                    "connection set-up, lazy optimizer state); with a single step, that step",
    "step_time": "per step every rank finished (a cancelled or live run's half-done last step "
                 "is not a step): the slowest rank's `step` span; run figure: the median over "
                 "the steady steps",
    "peak_memory": "per rank: the sum of every component's peak (params, grads, optimizer, "
                   "activations, pipeline receive buffers, ZeRO-3's gathered unit, collective "
                   "buffers), what the memory chart stacks and the theory predicts; run figure: "
                   "the busiest rank's",
    "overlap": "100 * |compute ∩ comm| / |comm|, summed over the steady steps and every rank "
               "(share of communication hidden under compute); blocking collectives are never "
               "compute",
    "exposed_comm": "communication not under compute (nor inside the pipeline bubble), mean per "
                    "steady step and rank",
    "bubble": "measured: per stage, the time inside the step's pipeline window (first to last "
              "F/B/W/BW action on any rank) when the rank runs no compute, over the window "
              "(idle / makespan, the simulator's and the closed form's convention); run figure: "
              "mean over stages of the mean over steady steps. Simulated: jobs.schedules with the "
              "run's mean measured F/B/W times. Closed form: (p-1)/(v*m+p-1)",
    "straggler": f"per step, the rank that arrived last at the collectives (point-to-point "
                 f"left out: a pipeline's waits are its bubble) that made the others wait "
                 f"longest; flagged when that wait is >= "
                 f"{STRAGGLER_MIN_WAIT_FRACTION:.0%} of the step and above the clock error bound; "
                 f"named for the run when flagged in >= {STRAGGLER_MIN_STEP_SHARE:.0%} of the "
                 "steady steps",
}


def steady(steps) -> list[int]:
    """The steps aggregates cover (sorted): those after the warm-up, or all if none are."""
    steps = sorted(set(steps))
    later = [s for s in steps if s >= WARMUP_STEPS]
    return later or steps


def steady_range(steps) -> list[int] | None:
    """[first, last] of the steady steps, for labels ("steps 1-4"), or None."""
    s = steady(steps)
    return [s[0], s[-1]] if s else None


def median_steady(values: dict[int, float | None]) -> float | None:
    """Median over the steady steps of per-step values (None values ignored)."""
    vals = [values[s] for s in steady(values) if values[s] is not None]
    return statistics.median(vals) if vals else None
