"""Per step and rank: compute, communication, exposed communication, idle, overlap; throughput.

Definitions (docs/analysis.md): inside the rank's `step` span [t0, t1] (or the extent of the
step's records when the span is missing),

    comm        union of the step's `comm` records [ts, ts + dur] (issue to completion)
    compute     union of `span` records with cat `compute`, minus the blocking communication
                nested in them (a synchronous collective inside a forward span is time the host
                spent waiting, not computing; see `is_blocking`)
    overlap     compute ∩ comm;  exposed comm = comm − compute
    idle        step − (compute ∪ comm)
    overlap_pct 100 · |overlap| / |comm|  (None when the step has no communication)

Standard library only.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from . import intervals as iv
from .load import Traces

NS = 1e9
COMPUTE_CATS = ("compute",)


def _end(r: dict) -> int:
    return r["ts_ns"] + r.get("dur_ns", 0)


def is_blocking(c: dict, compute_spans: list[tuple[int, int]]) -> bool:
    """Whether a comm record kept the host from computing: an explicit `async` field wins;
    bucketed (DDP / ZeRO) ops and ops completed at `wait()` / seen only at issue are
    asynchronous; otherwise an op nested entirely in a compute span ran synchronously inside it.
    An op outside compute spans does not overlap compute, so the answer does not matter."""
    if isinstance(c.get("async"), bool):
        return not c["async"]
    if "bucket" in c or c.get("end") in ("wait", "issue"):
        return False
    s, e = c["ts_ns"], _end(c)
    return any(a <= s and e <= b for a, b in compute_spans)


def group_by_step(recs: list[dict]) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = defaultdict(list)
    for r in recs:
        st = r.get("step")
        if isinstance(st, int) and st >= 0 and r.get("type") in ("span", "comm", "mem"):
            out[st].append(r)
    return out


def step_row(step: int, rank: int, coords: dict, recs: list[dict]) -> dict | None:
    """One row of the step_rank table from one rank's records of one step."""
    timed = [r for r in recs if r.get("type") in ("span", "comm")]
    if not timed:
        return None
    steps = [r for r in timed if r.get("type") == "span" and r.get("cat") == "step"]
    if steps:
        t0, t1 = steps[0]["ts_ns"], _end(steps[0])
    else:
        t0, t1 = min(r["ts_ns"] for r in timed), max(_end(r) for r in timed)
    comp_spans = [(r["ts_ns"], _end(r)) for r in timed
                  if r["type"] == "span" and r.get("cat") in COMPUTE_CATS]
    comms = [r for r in timed if r["type"] == "comm"]
    blocking = iv.union((c["ts_ns"], _end(c)) for c in comms if is_blocking(c, comp_spans))
    compute = iv.clip(iv.subtract(iv.union(comp_spans), blocking), t0, t1)
    comm = iv.clip(iv.union((c["ts_ns"], _end(c)) for c in comms), t0, t1)
    overlap = iv.length(iv.intersect(compute, comm))
    comm_ns, comp_ns = iv.length(comm), iv.length(compute)
    busy = iv.length(iv.union(compute + comm))
    return {"step": step, "rank": rank, "coords": coords, "pp": coords.get("pp"),
            "dp": coords.get("dp"), "tp": coords.get("tp"),
            "step_s": (t1 - t0) / NS, "compute_s": comp_ns / NS, "comm_s": comm_ns / NS,
            "overlap_s": overlap / NS, "exposed_comm_s": (comm_ns - overlap) / NS,
            "idle_s": max(0, (t1 - t0) - busy) / NS,
            "overlap_pct": 100.0 * overlap / comm_ns if comm_ns else None,
            "comm_ops": len(comms), "has_step_span": bool(steps)}


def step_rank_table(tr: Traces) -> list[dict]:
    rows = []
    missing = 0
    for rank, recs in sorted(tr.ranks.items()):
        coords = tr.coords(rank)
        for step, srecs in sorted(group_by_step(recs).items()):
            row = step_row(step, rank, coords, srecs)
            if row is not None:
                missing += not row["has_step_span"]
                rows.append(row)
    if missing:
        tr.warnings.append(f"{missing} (step, rank) pair(s) without a `step` span: window taken "
                           "from the extent of their records (an unfinished step)")
    return rows


def tokens_per_step(spec: dict | None) -> int | None:
    """Tokens in one optimizer step (the same rule as jobs.train.tokens_per_step): samples,
    times seq_len for gpt."""
    if not spec or spec.get("kind", "train") != "train":
        return None
    model, train = spec.get("model") or {}, spec.get("train") or {}
    gb = train.get("global_batch")
    if not gb:
        return None
    return int(gb) * (int(model.get("seq_len", 1)) if model.get("arch") == "gpt" else 1)


def throughput_table(step_rows: list[dict], spec: dict | None, summary: dict | None) -> list:
    """Per step: step time (slowest rank's step span), tokens/s, loss (from summary.json)."""
    by_step: dict[int, list[float]] = defaultdict(list)
    for r in step_rows:
        by_step[r["step"]].append(r["step_s"])
    losses = (summary or {}).get("loss") or []
    tokens = tokens_per_step(spec)
    rows = []
    for step in sorted(set(by_step) | set(range(len(losses)))):
        t = max(by_step[step]) if by_step.get(step) else None
        loss = losses[step] if step < len(losses) else None
        rows.append({"step": step, "step_s": t, "ranks": len(by_step.get(step, [])),
                     "tokens": tokens,
                     "tokens_per_s": tokens / t if tokens and t else None,
                     "loss": loss if isinstance(loss, int | float) else None})
    return rows


def median_after_first(values: dict[int, float]) -> float | None:
    """Median over steps >= 1 (step 0 carries warm-up), or over all steps if only one."""
    vals = [v for s, v in sorted(values.items()) if s >= 1 and v is not None]
    if not vals:
        vals = [v for v in values.values() if v is not None]
    return statistics.median(vals) if vals else None
