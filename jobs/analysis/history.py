"""Joins with the history (done by the backend, which holds it): a run's collectives next to
the latest bandwidth sweep (job kind `collective_bench`) of the same hosts. Pure functions on
plain dicts; standard library only.
"""

from __future__ import annotations

import math
from collections import defaultdict


def sweep_points(sweep_summary: dict) -> dict[tuple[str, int], list[tuple[int, float]]]:
    """(op, n) -> [(bytes, busbw GB/s)] of the sweep's built-in (backend) algorithm points."""
    out: dict[tuple[str, int], list] = defaultdict(list)
    for r in (sweep_summary or {}).get("results") or []:
        if r.get("algorithm", "builtin") != "builtin" or r.get("correct") is False:
            continue
        bw, nbytes = r.get("busbw_GBps"), r.get("bytes")
        n = r.get("n") or sweep_summary.get("world_size")
        if isinstance(bw, int | float) and isinstance(nbytes, int) and nbytes > 0 and n:
            out[(r.get("op"), int(n))].append((nbytes, float(bw)))
    return {k: sorted(v) for k, v in out.items()}


def bandwidth_vs_sweep(bandwidth_rows: list[dict], sweep_summary: dict) -> list[dict]:
    """Each row of the run's `bandwidth` table (median busbw per op, group size and payload
    over the steady steps) next to the sweep's point of the nearest size (log scale), same op
    and group size; ratio = measured / sweep."""
    pts = sweep_points(sweep_summary)
    rows = []
    for b in bandwidth_rows:
        op, n, size = b["op"], b["group_size"], b["payload_bytes"]
        cand = pts.get((op, n)) or []
        near = min(cand, key=lambda p: abs(math.log(p[0] / size))) if cand and size else None
        measured = b["busbw_GBps"]
        rows.append({"op": op, "axis": b["axis"], "group_size": n, "payload_bytes": size,
                     "instances": b["instances"], "measured_busbw_GBps": measured,
                     "sweep_bytes": near[0] if near else None,
                     "sweep_busbw_GBps": near[1] if near else None,
                     "ratio": measured / near[1] if near and near[1] else None})
    return rows
