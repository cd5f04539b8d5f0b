"""The parts of the run summary measured from every rank's traces: per-stage bubble and memory
and bytes per mesh axis (summary.json's `pipeline.stages` and `bytes_by_axis`). Rank 0 computes
them at the end of the run from the traces in its folder; on a multi-host run its folder holds
only its own host's ranks, so node 0's worker computes them again once every node's traces are
gathered (refresh_summary). One definition for both. Standard library only."""

from __future__ import annotations

from pathlib import Path

from .collectives import axis_bytes_table
from .load import Traces, load_run_dir
from .pipeline import stage_bubbles_table
from .steps import step_rank_table


def stage_memory(tr: Traces) -> dict[int, dict]:
    """pp -> peak in-flight micro-batches (chunks) and activation bytes over the stage's ranks
    (the pipeline runtimes' `mem` records)."""
    out: dict = {}
    for rank, recs in tr.ranks.items():
        cur = out.setdefault(int(tr.coords(rank).get("pp", rank) or 0),
                             {"peak_inflight_microbatches": 0, "peak_activation_bytes": 0})
        for r in recs:
            if r.get("type") == "mem" and "inflight_microbatches" in r:
                cur["peak_inflight_microbatches"] = max(cur["peak_inflight_microbatches"],
                                                        r["inflight_microbatches"])
                cur["peak_activation_bytes"] = max(cur["peak_activation_bytes"],
                                                   r.get("activations", 0))
    return dict(sorted(out.items()))


def trace_sections(tr: Traces, spec) -> tuple[dict, dict]:
    """(pipeline stages keyed "0".."pp-1", bytes sent per rank and mesh axis)."""
    rows = {r["stage"]: r for r in stage_bubbles_table(tr, spec, None, step_rank_table(tr))}
    memory = stage_memory(tr)
    stages = {str(s): {"idle_fraction": rows.get(s, {}).get("measured_idle_fraction"),
                       "simulated_idle_fraction": rows.get(s, {}).get("simulated"),
                       "steps": rows.get(s, {}).get("steps"), **memory.get(s, {})}
              for s in range(spec.parallel.pp)}
    by_axis: dict = {}
    for r in axis_bytes_table(tr):
        by_axis.setdefault(str(r["rank"]), {})[r["axis"]] = r["bytes_sent"]
    return stages, by_axis


def refresh_summary(out_dir: Path, spec, summary: dict) -> dict:
    """`summary` with its trace-measured sections recomputed from the traces now in
    `out_dir` (every host's, after a multi-host run's traces are gathered)."""
    if "pipeline" not in summary and "bytes_by_axis" not in summary:
        return summary
    stages, by_axis = trace_sections(load_run_dir(out_dir), spec)
    out = dict(summary)
    if "pipeline" in out:
        out["pipeline"] = {**out["pipeline"], "stages": stages}
    if "bytes_by_axis" in out:
        out["bytes_by_axis"] = by_axis
    return out
