"""The step_rank table vectorised, for runs without pipeline actions (a pipeline's
bubble windows stay in steps.py: `None`): np_steps.build sweeps each rank's Parquet file per
step range (the interval algebra is described there); this module decides where it applies,
cuts step ranges for np_coll, and forms steps.step_row's dicts from the sweep's integers
(float figures formed in Python exactly as step_row forms them).
"""

from __future__ import annotations

from pathlib import Path

from . import np_steps as NS
from . import steps as S
from .load import Traces
from .vec_tables import in_args

NS_PER_S = 1e9  # ns per second

FIELDS = ("step", "cat", "ts_ns", "dur_ns", "async", "bucket", "end", "loss", "loss_weight")


def applies(con) -> bool:
    """No pipeline action spans and no field the sweep reads hidden in args (np_steps reads
    the columns only)."""
    acts = ", ".join(f"'{a}'" for a in S.ACTIONS)
    if con.execute(f"SELECT count(*) FROM t WHERE type = 'span' AND action IN ({acts})"
                   ).fetchall()[0][0]:
        return False
    return not (in_args(con, "span", FIELDS) or in_args(con, "comm", FIELDS))


def build(out_dir: Path):
    """np_steps.build: per rank and step range, the step_rank integers."""
    return NS.build(out_dir)


def _row(x: dict, coords: dict) -> dict:
    """A step_rank row (steps.step_row's keys) from one rank-step's integer figures."""
    span, comm_ns, overlap = x["t1"] - x["t0"], x["comm_ns"], x["overlap_ns"]
    return {"step": x["step"], "rank": x["rank"], "coords": coords,
            "pp": coords.get("pp"), "dp": coords.get("dp"), "tp": coords.get("tp"),
            "step_s": span / NS_PER_S, "compute_s": x["compute_ns"] / NS_PER_S,
            "comm_s": comm_ns / NS_PER_S, "overlap_s": overlap / NS_PER_S,
            "exposed_comm_s": x["exposed_ns"] / NS_PER_S, "bubble_s": None,
            "pipeline_window_s": None, "pipeline_idle_s": None,
            "idle_s": max(0, span - x["busy_ns"]) / NS_PER_S,
            "overlap_pct": 100.0 * overlap / comm_ns if comm_ns else None,
            "comm_ops": x["comm_ops"], "has_step_span": bool(x["has_step"]),
            "loss": x["loss"], "loss_weight": x["loss_weight"]}


def step_rank_table(con, tr: Traces, out_dir: Path | None) -> list[dict] | None:
    """steps.step_rank_table's rows (and its warning), or None for a pipeline run."""
    if out_dir is None or not applies(con):
        return None
    rows, missing = [], 0
    for c in build(out_dir):
        cols = {k: v.tolist() for k, v in c.items()}
        recs = [dict(zip(cols, vals, strict=True)) for vals in zip(*cols.values(), strict=True)]
        for x in recs:
            rows.append(_row(x, tr.coords(x["rank"])))
            missing += not x["has_step"]
    rows.sort(key=lambda r: (r["rank"], r["step"]))
    if missing:
        tr.warnings.append(S.no_step_span(missing))
    return rows
