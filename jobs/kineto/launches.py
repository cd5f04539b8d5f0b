"""CPU -> GPU launches of one rank (HTA's CUDA kernel launch statistics): each GPU activity
joined to the CUDA runtime call that launched it by their correlation id.

Definitions (HTA 0.5.0, hta/analyzers/cuda_kernel_analysis.py, docs "CUDA Kernel Launch
Statistics"): cpu_duration = the runtime call's duration, gpu_duration = the GPU activity's
duration, launch_delay = the activity's start - the runtime call's end (how long the work
waited for the GPU once the CPU had queued it; negative when the GPU started it before the
call returned). The per-rank summary below (counts, median / p95 / max) is paralab's.
"""

from __future__ import annotations

from jobs.kineto.records import RankTrace

RULES = {
    "launch_delay_us": "HTA: GPU activity start - end of the CUDA runtime call that launched "
                       "it (joined on the correlation id); paralab shows median, p95 and max.",
    "cpu_duration_us": "HTA: the CUDA runtime call's duration (cudaLaunchKernel, "
                       "cudaMemcpyAsync, ...).",
    "short_kernels": "paralab: launches whose GPU work took less time than the CPU spent "
                     "launching it (gpu_duration < cpu_duration): the GPU outpaces the CPU.",
}


def _pct(sorted_values: list[float], q: float) -> float:
    i = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[i]


def launch_rows(rt: RankTrace) -> list[dict]:
    """One {kernel, cpu_duration, gpu_duration, launch_delay} per GPU activity with a launch."""
    calls = {r["correlation"]: r for r in rt.runtime if r["correlation"] >= 0}
    out = []
    for k in rt.kernels:
        c = calls.get(k["correlation"])
        if c is None or k["correlation"] < 0:
            continue
        out.append({"name": k["name"], "stream": k["stream"], "cpu_duration": float(c["dur"]),
                    "gpu_duration": float(k["dur"]),
                    "launch_delay": float(k["ts"]) - (float(c["ts"]) + float(c["dur"]))})
    return out


def launch_summary(rt: RankTrace) -> dict | None:
    rows = launch_rows(rt)
    if not rows:
        return None
    delay = sorted(r["launch_delay"] for r in rows)
    cpu = [r["cpu_duration"] for r in rows]
    return {"rank": rt.rank, "launches": len(rows),
            "launch_delay_median_us": _pct(delay, 0.5), "launch_delay_p95_us": _pct(delay, 0.95),
            "launch_delay_max_us": delay[-1], "cpu_duration_mean_us": sum(cpu) / len(cpu),
            "short_kernels": sum(r["gpu_duration"] < r["cpu_duration"] for r in rows)}
