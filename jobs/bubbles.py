"""Per-stage pipeline bubbles, activation memory and per-axis bytes from trace files (no torch).

Reads `trace-rank{R}.jsonl` (docs/trace-schema.md). A rank's busy time in a step is the sum of
its pipeline compute spans (records with an `action` in F / B / W / BW); the step's window runs
from the first such span's start on any rank to the last one's end on any rank, so

    idle_fraction(rank) = 1 - busy / window

the same convention as `jobs.schedules.simulate` (idle over makespan; closed form
(p-1)/(v*m+p-1) for GPipe / 1F1B / interleaved with equal stages). Ranks are grouped into stages
by their `pp` mesh coordinate (meta record `coords`); ranks of one stage (TP / DP peers) are
averaged.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

ACTIONS = ("F", "B", "W", "BW")


def load(trace_dir: Path) -> dict[int, list[dict]]:
    """rank -> records, from every trace-rank*.jsonl in `trace_dir` (torn last lines skipped)."""
    out = {}
    for path in sorted(Path(trace_dir).glob("trace-rank*.jsonl")):
        recs = []
        for line in path.read_text().splitlines():
            try:
                recs.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        if recs:
            out[int(path.stem.split("rank")[-1])] = recs
    return out


def _pp_coord(rank: int, recs: list[dict]) -> int:
    for r in recs:
        if r.get("type") == "meta":
            return int((r.get("coords") or {}).get("pp", rank))
    return rank


def stage_bubbles(traces: dict[int, list[dict]], steps: list[int] | None = None) -> dict:
    """{"steps": {step: {"window_s", "stages": {pp: {...}}}}, "stages": {pp: mean over steps}}."""
    spans = defaultdict(lambda: defaultdict(list))  # step -> rank -> [(start, end)]
    for rank, recs in traces.items():
        for r in recs:
            if r.get("type") == "span" and r.get("action") in ACTIONS:
                spans[r["step"]][rank].append((r["ts_ns"], r["ts_ns"] + r["dur_ns"]))
    coord = {rank: _pp_coord(rank, recs) for rank, recs in traces.items()}
    out: dict = {"steps": {}, "stages": {}}
    for step in sorted(spans) if steps is None else steps:
        by_rank = spans.get(step)
        if not by_rank:
            continue
        t0 = min(s for v in by_rank.values() for s, _ in v)
        t1 = max(e for v in by_rank.values() for _, e in v)
        window = (t1 - t0) / 1e9
        stages = defaultdict(list)
        for rank, v in by_rank.items():
            busy = sum(e - s for s, e in v) / 1e9
            stages[coord[rank]].append({"rank": rank, "busy_s": busy,
                                        "idle_fraction": 1 - busy / window if window else 0.0})
        out["steps"][step] = {"window_s": window, "stages": {
            pp: {"ranks": [x["rank"] for x in rs],
                 "busy_s": sum(x["busy_s"] for x in rs) / len(rs),
                 "idle_fraction": sum(x["idle_fraction"] for x in rs) / len(rs)}
            for pp, rs in sorted(stages.items())}}
    per_stage = defaultdict(list)
    for st in out["steps"].values():
        for pp, v in st["stages"].items():
            per_stage[pp].append(v["idle_fraction"])
    out["stages"] = {pp: {"idle_fraction": sum(v) / len(v), "steps": len(v)}
                     for pp, v in sorted(per_stage.items())}
    return out


def measured_stage_times(traces: dict[int, list[dict]], steps: list[int],
                         n_stages: int) -> dict:
    """Mean duration (s) of F, B (or BW) and W per global stage over `steps`: the stage times
    to feed `schedules.simulate` so it predicts this run's bubble from its real action costs
    (a BW counts as input-gradient time, W then 0)."""
    acc: dict = defaultdict(list)
    for recs in traces.values():
        for r in recs:
            if r.get("type") == "span" and r.get("action") in ACTIONS and r["step"] in steps:
                kind = "B" if r["action"] == "BW" else r["action"]
                acc[(kind, r.get("stage", 0))].append(r["dur_ns"] / 1e9)

    def mean(kind: str, s: int) -> float:
        v = acc.get((kind, s))
        return sum(v) / len(v) if v else 0.0

    return {"t_f": [mean("F", s) for s in range(n_stages)],
            "t_b_input": [mean("B", s) for s in range(n_stages)],
            "t_b_weight": [mean("W", s) for s in range(n_stages)]}


def stage_memory(traces: dict[int, list[dict]]) -> dict:
    """pp -> peak in-flight micro-batches (chunks) and activation bytes over the stage's ranks."""
    out: dict = {}
    for rank, recs in traces.items():
        pp = _pp_coord(rank, recs)
        cur = out.setdefault(pp, {"peak_inflight_microbatches": 0, "peak_activation_bytes": 0})
        for r in recs:
            if r.get("type") == "mem" and "inflight_microbatches" in r:
                cur["peak_inflight_microbatches"] = max(cur["peak_inflight_microbatches"],
                                                        r["inflight_microbatches"])
                cur["peak_activation_bytes"] = max(cur["peak_activation_bytes"],
                                                   r.get("activations", 0))
    return dict(sorted(out.items()))


def axis_bytes(traces: dict[int, list[dict]], step: int | None = None) -> dict:
    """rank -> axis -> bytes sent (summed over comm records, optionally of one step)."""
    out: dict = {}
    for rank, recs in sorted(traces.items()):
        acc: dict = defaultdict(float)
        for r in recs:
            if r.get("type") == "comm" and (step is None or r.get("step") == step):
                acc[r.get("axis", "?")] += r.get("bytes_sent", 0.0)
        out[rank] = dict(acc)
    return out


def summary(trace_dir: Path, skip_first_step: bool = True) -> dict:
    """What a run summary carries: per-stage bubble, per-stage memory, per-rank per-axis bytes."""
    traces = load(trace_dir)
    b = stage_bubbles(traces)
    steps = sorted(b["steps"])
    if skip_first_step and len(steps) > 1:
        b = stage_bubbles(traces, steps[1:])
    return {"bubble": {str(k): v for k, v in b["stages"].items()},
            "memory": {str(k): v for k, v in stage_memory(traces).items()},
            "bytes_by_axis": {str(k): v for k, v in axis_bytes(traces).items()}}
