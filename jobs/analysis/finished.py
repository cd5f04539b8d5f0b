"""Which steps are steps: a step that not every rank finished is not one.

A cancelled or live run's last step has records on some ranks and no end on some: timed as the
extent of its records so far, it read as a short step (a 6x tokens/s spike on the throughput
curve and in throughput.csv). Both engines (oracle.steps.throughput_table, step_tables.
write_throughput) leave such steps out of the throughput table and so out of the step time
and tokens/s figures; the step_rank rows stay (the Gantt and the diagnosis show what was
traced). Standard library only.
"""

from __future__ import annotations

from collections import defaultdict

from jobs.trace_schedule import compact_ranges


def unfinished_steps(marks, warnings: list[str] | None = None) -> set[int]:
    """Steps some rank started and not every rank finished: `marks` are (step, rank, finished)
    per step_rank row (finished: it has its `step` span) and per `scalars` record (written at
    the step's end: finished). A cancelled or live run's last step is one: its step time is
    the extent of the records so far, not a step, so the throughput table (its curve, the
    step time and tokens/s figures, throughput.csv) leaves it out and `warnings` says so. A
    trace that marks no step's end (no `step` span, no scalars) has none."""
    ranks: set[int] = set()
    done: dict[int, set[int]] = defaultdict(set)
    seen: set[int] = set()
    for step, rank, fin in marks:
        ranks.add(rank)
        seen.add(step)
        if fin:
            done[step].add(rank)
    if not done:
        return set()
    bad = {s for s in seen if not done.get(s, set()) >= ranks}
    if bad and warnings is not None:
        warnings.append(f"step(s) {compact_ranges(sorted(bad))} not finished by every rank: "
                        "left out of the throughput table and the step time (not a step)")
    return bad


def step_marks(step_rows: list[dict], scalars: list[dict] | None):
    """unfinished_steps' (step, rank, finished) of the oracle's rows (devtools/oracle/steps.py)."""
    for r in step_rows:
        yield r["step"], r["rank"], bool(r.get("has_step_span"))
    for r in scalars or []:
        yield r["step"], r["rank"], isinstance(r.get("step_s"), int | float)
