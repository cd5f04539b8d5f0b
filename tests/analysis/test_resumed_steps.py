"""A resumed run's throughput table numbers its losses as its step times (issue 37, item 8):
summary.json's loss[i] is global step start_step + i (jobs/summary.resumed), the traces'
steps are global, so both columns sit on the same rows and the run page's loss and step-time
charts share one step axis."""

from __future__ import annotations

from devtools.oracle.steps import throughput_table


def _rows(steps):
    return [{"step": s, "rank": r, "step_s": 0.01 * (s + 1), "has_step_span": True}
            for s in steps for r in (0, 1)]


def test_a_resumed_runs_losses_sit_on_its_global_steps():
    summary = {"loss": [0.5, 0.4], "start_step": 4}
    rows = throughput_table(_rows([4, 5]), None, summary)
    assert [(r["step"], r["loss"], r["step_s"]) for r in rows] == [(4, 0.5, 0.05), (5, 0.4, 0.06)]


def test_a_run_from_step_0_is_unchanged():
    rows = throughput_table(_rows([0, 1]), None, {"loss": [0.9, 0.8]})
    assert [(r["step"], r["loss"]) for r in rows] == [(0, 0.9), (1, 0.8)]
