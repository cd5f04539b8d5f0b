"""Memory measured vs predicted per rank and component, with the error in %.

Measured: the peak over a rank's `mem` records of each component (`params`, `grads`, `optimizer`,
`activations`, the pipeline's `recv_buffers`, ZeRO-3's `gathered_peak` shown as `gathered_unit`,
the data-parallel `comm_buffers`); where the trace's samples carry no model state
(the model-parallel runner samples activations only) the rank's `summary.json` peaks are used
(`source` says which). Predicted: jobs.theory (see predicted.py). `formula_bytes` is the seeds'
formula on the measured Ψ (summary.json `formula_check`, data-parallel strategies), which a
reference engine matches exactly; `padding_elems` is the shard padding (ZeRO), reported apart.

Peak memory has one definition: a rank's peak is the sum of every component's peak,
model state + activations + transient buffers (the `total` row of each rank), the sum the run
page's chart stacks and jobs.theory predicts (`memory.per_rank_bytes`, seed 003: "实际峰值受
聚合粒度、预取与通信缓冲影响"); the run's `peak_memory_bytes` is the largest rank's `total`
(peak_bytes). The card, the runs list, compare, the CSV and the chart all read those rows.
Standard library only.
"""

from __future__ import annotations

from . import predicted as P
from .storage.load import Traces

STATE = ("params", "grads", "optimizer")
# `allocator`: an imported profiler trace's allocator total (jobs/kineto/convert.py: every
# tensor of the device, not split into components); no paralab run writes it
EXTRA = ("activations", "recv_buffers", "gathered_unit", "comm_buffers", "allocator")
TRANSIENT = ("recv_buffers", "gathered_unit", "comm_buffers")
PARTS = STATE + EXTRA  # what a rank's peak (`total`) sums
MEASURED_KEY = {"gathered_unit": "gathered_peak"}  # the trace's name for the component
TOTAL = "total"


def measured(tr: Traces, rank: int, peaks: dict[int, dict] | None = None) -> tuple[dict, str]:
    """(component -> peak over the rank's `mem` samples, "trace"), or the summary's peaks
    when the samples carry no model state. `peaks`: the trace part already computed
    (trace_sql.mem_peaks, the engine: no records in `tr`)."""
    peak: dict[str, int] = dict(peaks.get(rank) or {}) if peaks is not None else {}
    for r in tr.ranks.get(rank, []) if peaks is None else ():
        if r.get("type") != "mem":
            continue
        for k in STATE + EXTRA:
            v = r.get(MEASURED_KEY.get(k, k))
            if isinstance(v, int | float):
                peak[k] = max(peak.get(k, 0), int(v))
    source = "trace"
    if not any(k in peak for k in (*STATE, "allocator")):
        srank = _summary_rank(tr.summary, rank)
        pb = ((srank or {}).get("memory") or {}).get("peak_bytes") or {}
        for k in STATE + EXTRA:
            v = pb.get(MEASURED_KEY.get(k, k))
            if isinstance(v, int | float):
                peak[k] = max(peak.get(k, 0), int(v))
        source = "summary" if pb else "none"
    return peak, source


def _summary_rank(summary: dict | None, rank: int) -> dict | None:
    for r in (summary or {}).get("ranks") or []:
        if isinstance(r, dict) and r.get("rank") == rank:
            return r
    return None


def _formula(summary: dict | None, rank: int) -> dict:
    for r in ((summary or {}).get("formula_check") or {}).get("ranks") or []:
        if r.get("rank") == rank:
            return r.get("memory_formula") or {}
    return {}


def _err(m, p):
    if m is None or p is None:
        return None
    if not p:
        return 0.0 if m == 0 else None
    return 100.0 * (m - p) / p


def memory_table(tr: Traces, spec, pred: dict | None,
                 peaks: dict[int, dict] | None = None) -> list[dict]:
    """Per rank and component: measured peak vs predicted vs the seeds' formula. `peaks`:
    see measured (then `tr` holds only the records routing_activations reads)."""
    rows = []
    for rank in sorted(tr.ranks):
        coords = tr.coords(rank)
        peak, source = measured(tr, rank, peaks)
        if source == "none":
            tr.warnings.append(f"rank {rank}: no memory samples")
        pp, dp = int(coords.get("pp", 0) or 0), int(coords.get("dp", 0) or 0)
        want = P.rank_model_state(pred, spec, pp, dp)
        extra = P.rank_extra(pred, spec, pp, dp)
        if extra.get("activations"):
            extra["activations"] += P.routing_activations(pred, spec, tr.ranks.get(rank, []),
                                                         pp)
        formula = _formula(tr.summary, rank)
        layout = (_summary_rank(tr.summary, rank) or {}).get("layout") or {}
        pad = layout.get("padding_elems")
        start = len(rows)
        for comp in STATE + EXTRA:
            m = peak.get(comp)
            p = want.get(comp) if comp in STATE else extra.get(comp)
            if not m and not p:
                continue
            f = formula.get(comp)
            kind = "model state" if comp in STATE else \
                "transient" if comp in TRANSIENT else \
                "allocator total" if comp == "allocator" else "activations"
            rows.append({"rank": rank, "coords": coords, "component": comp, "kind": kind,
                         "measured_bytes": m,
                         "predicted_bytes": p, "error_pct": _err(m, p), "formula_bytes": f,
                         "deviation_bytes": m - f if m is not None and f is not None else None,
                         "padding_elems": pad, "source": source})
        ms = [peak.get(k) for k in STATE]
        if all(v is not None for v in ms):
            p = sum(want.values()) if want else None
            f = sum(formula[k] for k in STATE) if all(k in formula for k in STATE) else None
            rows.append({"rank": rank, "coords": coords, "component": "model_state",
                         "kind": "model state",
                         "measured_bytes": sum(ms), "predicted_bytes": p,
                         "error_pct": _err(sum(ms), p), "formula_bytes": f,
                         "deviation_bytes": sum(ms) - f if f is not None else None,
                         "padding_elems": pad, "source": source})
        total = _total_row(rows[start:])
        if total is not None:
            rows.append({"rank": rank, "coords": coords, **total, "padding_elems": pad,
                         "source": source})
    return rows


def _total_row(rows: list[dict]) -> dict | None:
    """The rank's peak memory (`rows`: the rank's rows): Σ over its component rows (model
    state, activations, transient buffers) of measured and of predicted bytes. None without a
    measured component."""
    parts = [r for r in rows if r["component"] in PARTS]
    if not any(r["measured_bytes"] is not None for r in parts):
        return None
    m = sum(r["measured_bytes"] or 0 for r in parts)
    preds = [r["predicted_bytes"] for r in parts if r["predicted_bytes"] is not None]
    p = sum(preds) if preds else None
    return {"component": TOTAL, "kind": "peak (every component)", "measured_bytes": m,
            "predicted_bytes": p, "error_pct": _err(m, p), "formula_bytes": None,
            "deviation_bytes": None}


def rank_peaks(rows: list[dict]) -> dict[int, int]:
    """rank -> its peak memory (the `total` rows of the memory table)."""
    return {r["rank"]: r["measured_bytes"] for r in rows
            if r["component"] == TOTAL and r["measured_bytes"] is not None}


def peak_bytes(rows: list[dict]) -> int | None:
    """The run's peak memory (`headline.peak_memory_bytes`): the largest rank's peak, read from
    the memory table so that every page shows the figure its chart stacks."""
    return max(rank_peaks(rows).values(), default=None)
