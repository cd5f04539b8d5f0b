"""Stragglers: who arrived last at each collective, by how much, and the wait it caused
(docs/analysis.md). Built on the collectives table (collectives.py defines, per instance,
`last_rank`, `wait_s` = last − first arrival, `late_s` = last − second-latest arrival and
`others_wait_s` = Σ over the other ranks of (last − their arrival)). Standard library only.

    stragglers table        per step: the rank whose lateness made the others wait longest
                            (Σ wait_s of the step's instances it was last at), flagged under
                            rules.RULES["straggler"]
    straggler_ranks table   per rank over the steady steps: times last, Σ late_s,
                            Σ others_wait_s, cost per step
The engine computes both from integer sums kept as the instances are written (straggler_sums.py),
the oracle from the rows (devtools/oracle/stragglers.py). Here: the run's straggler from
either (straggler_of_run, straggler_of_flags) and its cost (straggler_cost).

Point-to-point is left out everywhere: a receive posted ahead of its send (every pipeline step)
makes the sender "last" by design; that wait is the pipeline's bubble.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from . import rules


def straggler_of_run(straggler_rows: list[dict]) -> dict:
    """The run's straggler (rules.RULES["straggler"]): {"rank", "flagged_steps", "steps",
    "caused_wait_median_s"}; rank None when no rank is flagged often enough."""
    use = set(rules.steady(r["step"] for r in straggler_rows))
    rows = [r for r in straggler_rows if r["step"] in use]
    flagged: dict[int, list[float]] = defaultdict(list)
    for r in rows:
        if r["flagged"]:
            flagged[r["rank"]].append(r["caused_wait_s"])
    return straggler_of_flags(flagged, len(rows))


def straggler_of_flags(flagged: dict[int, list[float]], steps: int) -> dict:
    """straggler_of_run from its inputs: per rank the caused waits of its flagged steady
    steps, and the number of steady steps (what the engine reads in SQL)."""
    out = {"rank": None, "flagged_steps": 0, "steps": steps, "caused_wait_median_s": None}
    if not flagged:
        return out
    rank = max(flagged, key=lambda k: (len(flagged[k]), -k))
    n = len(flagged[rank])
    if n >= rules.STRAGGLER_MIN_STEP_SHARE * steps:
        out.update(rank=rank, flagged_steps=n,
                   caused_wait_median_s=statistics.median(flagged[rank]))
    else:
        out["flagged_steps"] = n
    return out


def straggler_cost(rank: int | None, ranks_rows: list[dict]) -> dict:
    """The headline's cost of the run's straggler: the step time one of its late steps loses
    (`cost_median_s`: what the step would gain were it on time with the next-latest rank),
    the others' total wait for it and that wait's share."""
    row = next((r for r in ranks_rows if r["rank"] == rank), None)
    if row is None:
        return {"straggler_cost_s": None, "straggler_others_wait_s": None,
                "straggler_wait_share": None}
    return {"straggler_cost_s": row["cost_median_s"],
            "straggler_others_wait_s": row["others_wait_s"],
            "straggler_wait_share": row["wait_share"]}
