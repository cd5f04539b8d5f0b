"""Calibration: the advisor's ranking re-stated with measured figures (docs/advisor.md).

restate(members) -> {"rows", "spearman", "terms", "n"}
    members  [{"label", "predicted": {step_time_s, compute_s, bubble_s, comm_s},
               "measured": {step_time_s, compute_s, bubble_s, exposed_comm_s, idle_s}}]
             (the sweep page's members of a sweep launched from the advisor; the benchmark's
             runs). Members without a measured or a predicted step time are left out of the
             ranks and listed with their rank as None.

Terms compared, per rank per step (the advisor's breakdown, jobs/theory/advisor.py, against the
analysis headline, jobs/analysis/run.py, means over the steady (step, rank) rows):
    compute     predicted busy compute           vs measured compute_s
    bubble      predicted bubble (pipe - busy)   vs measured bubble_s (0 without a pipeline)
    comm        predicted Σ_axis comm (no overlap) vs measured exposed_comm_s
    step        predicted step                   vs measured step_time_s (slowest rank, median)
The measured idle_s (launch overhead, Python between ops) is what no term models: shown, not
scored. Spearman's rank correlation uses average ranks for ties. Standard library only.
"""

from __future__ import annotations

TERMS = (("compute", "compute_s", "compute_s"), ("bubble", "bubble_s", "bubble_s"),
         ("comm", "comm_s", "exposed_comm_s"), ("step", "step_time_s", "step_time_s"))


def average_ranks(values: list[float]) -> list[float]:
    """1-based ranks, ties sharing the mean of the ranks they span."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Spearman's rho: Pearson's correlation of the average ranks; None below 3 pairs or when
    either side is constant."""
    assert len(xs) == len(ys)
    if len(xs) < 3:
        return None
    rx, ry = average_ranks(list(xs)), average_ranks(list(ys))
    n = len(rx)
    mx, my = sum(rx) / n, sum(ry) / n
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    vx = sum((a - mx) ** 2 for a in rx)
    vy = sum((b - my) ** 2 for b in ry)
    return cov / (vx * vy) ** 0.5 if vx and vy else None


def _num(d: dict | None, key: str) -> float | None:
    v = (d or {}).get(key)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def restate(members: list[dict]) -> dict:
    rows = []
    for m in members:
        p, meas = m.get("predicted") or {}, m.get("measured") or {}
        row = {"label": m.get("label"), "index": m.get("index"), "terms": {},
               "idle_s": _num(meas, "idle_s")}
        for term, pk, mk in TERMS:
            pv, mv = _num(p, pk), _num(meas, mk)
            if term == "bubble" and mv is None and pv == 0.0:
                mv = 0.0  # no pipeline: the analysis leaves the bubble out, the theory says 0
            err = pv - mv if pv is not None and mv is not None else None
            row["terms"][term] = {"predicted_s": pv, "measured_s": mv, "error_s": err,
                                  "error_pct": 100.0 * err / mv if err is not None and mv
                                  else None}
        rows.append(row)
    ranked = [r for r in rows if r["terms"]["step"]["error_s"] is not None]
    pr = average_ranks([r["terms"]["step"]["predicted_s"] for r in ranked])
    mr = average_ranks([r["terms"]["step"]["measured_s"] for r in ranked])
    for r, a, b in zip(ranked, pr, mr, strict=True):
        r["predicted_rank"], r["measured_rank"] = a, b
    for r in rows:
        r.setdefault("predicted_rank", None)
        r.setdefault("measured_rank", None)
    rows.sort(key=lambda r: (r["measured_rank"] is None, r["measured_rank"] or 0))
    terms = {}
    for term, _pk, _mk in TERMS:
        errs = [r["terms"][term] for r in ranked if r["terms"][term]["error_s"] is not None]
        pcts = [abs(e["error_pct"]) for e in errs if e["error_pct"] is not None]
        terms[term] = {"members": len(errs),
                       "mean_abs_error_s": (sum(abs(e["error_s"]) for e in errs) / len(errs)
                                            if errs else None),
                       "mean_error_s": sum(e["error_s"] for e in errs) / len(errs)
                       if errs else None,
                       "mean_abs_error_pct": sum(pcts) / len(pcts) if pcts else None}
    rho = spearman([r["terms"]["step"]["predicted_s"] for r in ranked],
                   [r["terms"]["step"]["measured_s"] for r in ranked])
    return {"n": len(ranked), "spearman": rho, "terms": terms, "rows": rows}
