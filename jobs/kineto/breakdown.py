"""HTA's GPU figures on imported Kineto traces: temporal breakdown, communication /
computation overlap, kernel-type breakdown and top kernels.

Definitions follow Holistic Trace Analysis 0.5.0 (facebookresearch/HolisticTraceAnalysis):
``hta/analyzers/breakdown_analysis.py`` (get_temporal_breakdown, get_gpu_kernel_breakdown,
_get_gpu_kernel_type_time), ``hta/analyzers/communication_analysis.py``
(get_comm_comp_overlap), ``hta/utils/utils.py`` (get_kernel_type, merge_kernel_intervals)
and ``hta/common/trace.py`` (_filter_irrelevant_gpu_kernels). The rule text of each figure
is in RULES; tests compare every figure with HTA on public multi-GPU traces.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict

from jobs.analysis import intervals
from jobs.kineto import records
from jobs.kineto.records import (
    COMMUNICATION,
    COMPUTATION,
    DEVICE_SYNC_NAMES,
    MEMORY,
    RankTrace,
    kernel_type,
)

RULES = {
    **records.RULES,
    "gpu_kernels": (
        "HTA Trace.load_traces: when the traces hold more than one ProfilerStep name, the "
        "last profiler step is dropped: host events are kept if they start before the last "
        "ProfilerStep starts, GPU events (stream >= 0 and correlation >= 0, or Event/Context "
        "Sync) only if a kept host event has their correlation id. The analysed 'kernels' "
        "are the kept events with stream != -1 (kernels, memcpy, memset)."
    ),
    "merge": (
        "HTA merge_kernel_intervals: sort by start; an interval that starts after the "
        "running maximum end starts a new merged interval."
    ),
    "kernel_time_us": "HTA: end of the last merged kernel interval - start of the first.",
    "idle_time_us": "HTA: kernel_time - total length of all kernels' merged intervals.",
    "compute_time_us": "HTA: total length of the merged intervals of COMPUTATION kernels.",
    "non_compute_time_us": "HTA: kernel_time - compute_time - idle_time.",
    "idle_pct": "HTA idle_time_pctg: 100 * idle_time / kernel_time.",
    "compute_pct": "HTA compute_time_pctg: 100 * compute_time / kernel_time.",
    "non_compute_pct": "HTA non_compute_time_pctg: 100 * non_compute_time / kernel_time.",
    "overlap_pct": (
        "HTA comp_comm_overlap_pctg: 100 * time where merged COMMUNICATION and merged "
        "COMPUTATION intervals overlap / total merged COMMUNICATION time."
    ),
    "kernel_type_breakdown": (
        "HTA _get_gpu_kernel_type_time: the merged intervals of each type (COMPUTATION, "
        "COMMUNICATION, and MEMORY when asked) are swept together; every stretch of time is "
        "credited to the set of types running ('A overlapping B'), each stretch truncated "
        "to whole microseconds; percentages are of the sum over all ranks."
    ),
    "top_kernels": (
        "Per rank and kernel type, kernels grouped by name: count, sum, mean, min, max of "
        "duration, largest sum first (HTA get_gpu_kernel_breakdown before its 'others')."
    ),
}


def hta_kernels(
    ranks: dict[int, RankTrace], include_last_step: bool = False
) -> dict[int, list[dict]]:
    """Per rank, the GPU rows HTA analyses (RULES['gpu_kernels']), each with kernel_type."""
    step_names = {r["name"] for rt in ranks.values() for r in rt.hta_rows
                  if "ProfilerStep" in r["name"]}
    starts = [r["ts"] for rt in ranks.values() for r in rt.hta_rows]
    # HTA subtracts the earliest start of all ranks before adding durations; doing the
    # same keeps float end times exact (raw microsecond stamps are ~1e15).
    t0 = min(starts) if starts else 0
    out: dict[int, list[dict]] = {}
    for rank, rt in ranks.items():
        rows = rt.hta_rows
        if len(step_names) > 1:
            rows = _drop_last_step(rows, step_names, include_last_step)
        out[rank] = [{"name": r["name"], "ts": r["ts"] - t0, "end": (r["ts"] - t0) + r["dur"],
                      "stream": r["stream"], "correlation": r["correlation"],
                      "kernel_type": kernel_type(r["name"])}
                     for r in rows if r["stream"] != -1]
    return out


def _drop_last_step(rows: list[dict], step_names: set[str], include_last: bool) -> list[dict]:
    def on_gpu(r: dict) -> bool:
        return (r["stream"] >= 0 and r["correlation"] >= 0) or r["name"] in DEVICE_SYNC_NAMES

    host = [r for r in rows if not on_gpu(r)]
    step_rows = [r for r in host if r["name"] in step_names]
    if not step_rows:
        return []
    if include_last:
        limit = max(r["ts"] + r["dur"] for r in step_rows)
        kept = [r for r in host if r["ts"] <= limit]
    else:
        limit = max(r["ts"] for r in step_rows)
        kept = [r for r in host if r["ts"] < limit]
    # HTA joins GPU events to kept host events on correlation (an inner merge), so a
    # GPU event appears once per host event that carries its correlation id.
    times = Counter(r["correlation"] for r in kept)
    gpu = [r for r in rows if on_gpu(r) for _ in range(times.get(r["correlation"], 0))]
    return gpu + kept


def merge_intervals(rows: list[dict]) -> list[tuple[float, float]]:
    """RULES['merge']: disjoint intervals covering the rows' [ts, end]. Unlike
    jobs.analysis.intervals.union it keeps zero-length kernels, whose edges the kernel-type
    sweep (kernel_type_time) counts as HTA does; lengths and overlaps use `intervals`."""
    merged: list[list[float]] = []
    for r in sorted(rows, key=lambda r: r["ts"]):
        if merged and not r["ts"] > merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], r["end"])
        else:
            merged.append([r["ts"], r["end"]])
    return [(a, b) for a, b in merged]


def _union(kernels: list[dict]) -> list[tuple[float, float]]:
    return intervals.union((k["ts"], k["end"]) for k in kernels)


def temporal_breakdown(kernels: list[dict]) -> dict[str, float]:
    """One rank's idle / compute / non-compute time and % (RULES['idle_pct'] ...)."""
    if not kernels:
        raise ValueError("no GPU kernels in the trace: no temporal breakdown")
    # the merged intervals' span: the last end and the first start of all kernels
    kernel_time = max(k["end"] for k in kernels) - min(k["ts"] for k in kernels)
    idle = kernel_time - intervals.length(_union(kernels))
    compute = intervals.length(_union([k for k in kernels if k["kernel_type"] == COMPUTATION]))
    non_compute = kernel_time - compute - idle
    assert idle <= kernel_time and compute <= kernel_time and non_compute >= -1e-6

    def pct(x: float) -> float:
        return 100.0 * x / kernel_time if kernel_time else math.nan

    return {
        "kernel_time_us": kernel_time, "idle_time_us": idle, "compute_time_us": compute,
        "non_compute_time_us": non_compute, "idle_pct": pct(idle),
        "compute_pct": pct(compute), "non_compute_pct": pct(non_compute),
    }


def overlap_pct(kernels: list[dict]) -> float | None:
    """RULES['overlap_pct'] for one rank; None when the rank ran no communication."""
    comm = _union([k for k in kernels if k["kernel_type"] == COMMUNICATION])
    comp = _union([k for k in kernels if k["kernel_type"] == COMPUTATION])
    comm_time = intervals.length(comm)
    if comm_time <= 0:
        return None
    return 100.0 * intervals.length(intervals.intersect(comm, comp)) / comm_time


def kernel_type_time(kernels: list[dict], include_memory: bool = True) -> dict[str, int]:
    """RULES['kernel_type_breakdown'] for one rank: label -> microseconds."""
    types = [COMPUTATION, COMMUNICATION] + ([MEMORY] if include_memory else [])
    edges: list[tuple[float, int]] = []
    for bit, kt in enumerate(types):
        for a, b in merge_intervals([k for k in kernels if k["kernel_type"] == kt]):
            edges += [(a, 1 << bit), (b, -(1 << bit))]
    edges.sort(key=lambda e: e[0])
    out: dict[str, int] = defaultdict(int)
    running = 0
    for (t, delta), (t_next, _) in zip(edges, edges[1:], strict=False):
        running += delta
        if running > 0:
            label = " overlapping ".join(kt for bit, kt in enumerate(types) if running & (1 << bit))
            out[label] += int(t_next - t)
    return dict(out)


def kernel_type_breakdown(
    per_rank: dict[int, list[dict]], include_memory: bool = True
) -> list[dict]:
    """Across ranks: kernel_type, sum (us), percentage of the total, largest first."""
    total: dict[str, int] = defaultdict(int)
    for kernels in per_rank.values():
        for label, us in kernel_type_time(kernels, include_memory).items():
            total[label] += us
    grand = sum(total.values())
    rows = [{"kernel_type": k, "sum_us": v, "pct": 100.0 * v / grand if grand else math.nan}
            for k, v in total.items()]
    return sorted(rows, key=lambda r: (-r["sum_us"], r["kernel_type"]))


def top_kernels(kernels: list[dict], n: int | None = 10) -> list[dict]:
    """RULES['top_kernels'] for one rank: the n largest (type, name) groups by total
    time (all groups when n is None)."""
    groups: dict[tuple[str, str], list[float]] = defaultdict(list)
    for k in kernels:
        groups[(k["kernel_type"], k["name"])].append(k["end"] - k["ts"])
    rows = [{"kernel_type": kt, "name": name, "count": len(d), "sum_us": sum(d),
             "mean_us": sum(d) / len(d), "min_us": min(d), "max_us": max(d)}
            for (kt, name), d in groups.items()]
    rows.sort(key=lambda r: (-r["sum_us"], r["kernel_type"], r["name"]))
    return rows if n is None else rows[:n]


def analyse(ranks: dict[int, RankTrace], include_memory: bool = True) -> dict:
    """All HTA-defined figures for a set of ranks."""
    per_rank = hta_kernels(ranks)
    return {
        "temporal": {r: temporal_breakdown(k) for r, k in per_rank.items()},
        "overlap_pct": {r: overlap_pct(k) for r, k in per_rank.items()},
        "kernel_types": kernel_type_breakdown(per_rank, include_memory),
        "top_kernels": {r: top_kernels(k) for r, k in per_rank.items()},
        "rules": RULES,
    }
