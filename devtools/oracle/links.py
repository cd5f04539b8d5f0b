"""The oracle's links table from loaded records (as jobs/analysis/links.py defines it).
Independent of the columnar engine (bandwidth_links.links_table).
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from devtools.oracle.collectives import step_spans
from jobs.analysis import rules
from jobs.analysis.links import _Groups, link_of, rank_hosts
from jobs.analysis.storage.load import Traces


def links_table(tr: Traces, spec, coll_rows: list[dict], pred: dict | None) -> list[dict]:
    """Per (axis, link): bytes sent per step by the busiest rank (over the training steps, per
    step as in axis_bytes), the ranks and instances seen there, and the median transfer time and
    busbw of the steady steps' complete instances (collectives table); next to the theory's
    link, bytes, busbw and time of that axis (predict()["comm"]["links"])."""
    hosts, source = rank_hosts(tr, spec)
    groups = _Groups(tr, spec)
    steps = step_spans(tr)
    sent: dict[tuple, float] = defaultdict(float)  # (rank, axis, link) -> bytes, steps >= 0
    axis_steps: dict[tuple, set] = defaultdict(set)  # (rank, axis) -> steps of its records
    for rank, recs in sorted(tr.ranks.items()):
        for r in recs:
            if r.get("type") != "comm" or r.get("step", -1) < 0:
                continue
            axis = r.get("axis", "?")
            link = link_of(groups.members(rank, r), hosts)
            sent[(rank, axis, link)] += float(r.get("bytes_sent", 0.0))
            axis_steps[(rank, axis)].add(r["step"])
    per: dict[tuple, dict] = {}
    for (rank, axis, link), b in sent.items():
        n = len(steps[rank] | axis_steps[(rank, axis)])
        row = per.setdefault((axis, link), {"ranks": set(), "per_step": []})
        row["ranks"].add(rank)
        row["per_step"].append(b / n if n else 0.0)
    use = set(rules.steady(r["step"] for r in coll_rows if r["step"] >= 0))
    inst: dict[tuple, list[dict]] = defaultdict(list)
    for r in coll_rows:
        if r["step"] in use and r["complete"] and r["busbw_GBps"] is not None:
            inst[(str(r["axis"]), link_of(r["ranks"], hosts))].append(r)
    theory = {x["axis"]: x for x in (((pred or {}).get("comm") or {}).get("links") or {})
              .get("per_axis", [])}
    rows = []
    for axis, link in sorted(set(per) | set(inst)):
        p, rs, t = per.get((axis, link), {"ranks": set(), "per_step": []}), \
            inst.get((axis, link), []), theory.get(axis, {})
        rows.append({
            "axis": axis, "link": link, "ranks": len(p["ranks"]), "instances": len(rs),
            "bytes_sent_per_step": max(p["per_step"], default=None),
            "duration_median_s": statistics.median(x["duration_s"] for x in rs) if rs else None,
            "busbw_GBps": statistics.median(x["busbw_GBps"] for x in rs) if rs else None,
            "hosts": len(set(hosts.values()) - {None}), "hosts_source": source,
            "predicted_link": t.get("link"), "predicted_bytes": t.get("bytes_per_rank"),
            "predicted_busbw_GBps": t.get("busbw_GBps"), "predicted_time_s": t.get("time_s"),
            "predicted_bandwidth_source": t.get("bandwidth_source")})
    return rows
