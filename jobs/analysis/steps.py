"""The step tables' definitions (step_rank, ranks, throughput) and the per-record rules
they rest on; the engine computes them over the columnar trace (step_sweep.py, step_tables.py,
pipeline_spans.py), the oracle record by record (devtools/oracle/steps.py).

Per step and rank: compute, communication, exposed communication, pipeline bubble, idle;
per rank over the steady steps; throughput per step. Definitions (docs/analysis.md, wording
in rules.py): inside the rank's `step` span [t0, t1] (or the extent of the step's records when
the span is missing),

    comm        union of the step's `comm` records [ts, ts + dur] (issue to completion)
    compute     union of `span` records with cat `compute`, minus the blocking communication
                nested in them (a synchronous collective inside a forward span is time the host
                spent waiting, not computing; see `is_blocking`)
    pipeline_idle  pipeline runs: inside the step's pipeline window (first to last F/B/W/BW
                action of the rank's pipeline, any stage), the time the rank runs no compute
                span of any step (the simulator's idle; the stage bubble is
                pipeline_idle / window)
    bubble      pipeline_idle inside this rank's step window; comm in it (waiting on a
                neighbour's activation) is bubble, not exposed comm
    overlap     compute ∩ comm;  exposed comm = comm − compute − bubble
    idle        step − (compute ∪ comm ∪ bubble)
so compute_s + exposed_comm_s + bubble_s + idle_s = step_s exactly.

Bounded tracing (docs/trace-schema.md): the step_rank table has rows for the traced steps only
(the steps with detailed records); the throughput table has every step, its step time and loss
from the `scalars` records where a step was not traced (`traced` says which).

Here: the rules both read (is_blocking, is_action, pipeline_key, the Gantt's
pipeline_windows), the summed columns and the warning text. Standard library only.
"""

from __future__ import annotations

from jobs.spec import step_tokens

from .storage.load import Traces

NS = 1e9
COMPUTE_CATS = ("compute",)
ACTIONS = ("F", "B", "W", "BW")  # pipeline actions (jobs.schedules)


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


def is_action(r: dict) -> bool:
    return r.get("type") == "span" and r.get("action") in ACTIONS


def pipeline_key(coords: dict) -> tuple:
    """Ranks of one pipeline share every mesh coordinate but `pp`."""
    return tuple(sorted((k, v) for k, v in coords.items() if k != "pp"))


def pipeline_windows(tr: Traces) -> dict[tuple, tuple[int, int]]:
    """(step, pipeline key) -> (first action start, last action end) over the pipeline's
    ranks: the window a pipeline bubble is measured in (the simulator's makespan)."""
    out: dict[tuple, list[int]] = {}
    for rank, recs in tr.ranks.items():
        key = pipeline_key(tr.coords(rank))
        for r in recs:
            if is_action(r) and isinstance(r.get("step"), int) and r["step"] >= 0:
                w = out.setdefault((r["step"], key), [r["ts_ns"], _end(r)])
                w[0], w[1] = min(w[0], r["ts_ns"]), max(w[1], _end(r))
    return {k: (a, b) for k, (a, b) in out.items()}


def no_step_span(missing: int) -> str:
    """The warning of a step table with (step, rank) pairs that have no `step` span."""
    return (f"{missing} (step, rank) pair(s) without a `step` span: window taken from the "
            "extent of their records (an unfinished step)")


SUMMED = ("step_s", "compute_s", "comm_s", "overlap_s", "exposed_comm_s", "bubble_s", "idle_s")


def tokens_per_step(spec: dict | None) -> int | None:
    """Tokens in one optimizer step of a trace's spec dict (jobs.spec.step_tokens, the rule
    JobSpec.tokens_per_step uses); None for a bench or a spec without a global batch."""
    if spec and spec.get("kind") == "script":  # stated by the user (script.tokens_per_step)
        return int((spec.get("script") or {}).get("tokens_per_step") or 0) or None
    if not spec or spec.get("kind", "train") != "train":
        return None
    model, train = spec.get("model") or {}, spec.get("train") or {}
    gb = train.get("global_batch")
    if not gb:
        return None
    return step_tokens(int(gb), model.get("arch"), int(model.get("seq_len") or 1))
