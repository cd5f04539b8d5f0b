"""The oracle's straggler tables from the collectives and step_rank rows (as jobs/analysis/
stragglers.py defines them). Independent of the columnar engine (straggler_sums.py).
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from jobs.analysis import rules


def _collective_rows(coll_rows: list[dict]):
    for r in coll_rows:
        if r["step"] >= 0 and len(r["ranks"]) >= 2 and r["op"] != "send_recv":
            yield r


def stragglers_table(coll_rows: list[dict], step_rows: list[dict]) -> list[dict]:
    """Per step with multi-rank collectives: the rank that arrived last at the instances that
    made the others wait longest (sum of `wait_s` over the step's instances where it was last),
    and whether that wait passes the straggler threshold (rules.RULES["straggler"])."""
    caused: dict[int, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    times_last: dict[int, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    clock: dict[int, float] = defaultdict(float)
    for r in _collective_rows(coll_rows):
        caused[r["step"]][r["last_rank"]] += r["wait_s"]
        times_last[r["step"]][r["last_rank"]] += 1
        clock[r["step"]] = max(clock[r["step"]], r["clock_error_s"])
    step_s: dict[int, float] = defaultdict(float)
    for r in step_rows:
        step_s[r["step"]] = max(step_s[r["step"]], r["step_s"])
    rows = []
    for step in sorted(caused):
        c = caused[step]
        rank = max(c, key=lambda k: (c[k], -k))
        frac = c[rank] / step_s[step] if step_s.get(step) else None
        flagged = (frac is not None and frac >= rules.STRAGGLER_MIN_WAIT_FRACTION
                   and c[rank] > clock[step])
        rows.append({"step": step, "rank": rank, "caused_wait_s": c[rank],
                     "times_last": times_last[step][rank], "step_s": step_s.get(step),
                     "wait_fraction": frac, "clock_error_s": clock[step],
                     "flagged": bool(flagged)})
    return rows


def straggler_ranks_table(coll_rows: list[dict], step_rows: list[dict]) -> list[dict]:
    """Per rank, over the steady steps' collectives: how often it arrived last, the delay it
    alone caused (`late_s` = Σ late_s; `cost_per_step_s` = that over the steady steps;
    `cost_median_s` = the median over the `late_steps` steps where it was late at all: what
    one of its late steps costs in step time), the rank-seconds the others waited for it
    (Σ others_wait_s) and its share of all such waits."""
    ranks = {r["rank"] for r in step_rows} | {k for c in coll_rows for k in c["ranks"]}
    use = set(rules.steady(r["step"] for r in coll_rows if r["step"] >= 0))
    times: dict[int, int] = defaultdict(int)
    late: dict[int, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    others: dict[int, float] = defaultdict(float)
    for r in _collective_rows(coll_rows):
        if r["step"] in use:
            times[r["last_rank"]] += 1
            late[r["last_rank"]][r["step"]] += r.get("late_s", 0.0)
            others[r["last_rank"]] += r.get("others_wait_s", 0.0)
    total = sum(others.values())
    n = len(use)
    rows = []
    for k in sorted(ranks):
        per_step = [v for v in late[k].values() if v > 0]
        tot = sum(late[k].values())
        rows.append({"rank": k, "times_last": times[k], "late_s": tot,
                     "cost_per_step_s": tot / n if n else None,
                     "late_steps": len(per_step),
                     "cost_median_s": statistics.median(per_step) if per_step else None,
                     "others_wait_s": others[k],
                     "wait_share": others[k] / total if total else None, "steps": n})
    return rows
