"""The per-step tables at scale (engine.py): steps.py's tables over a converted run's
Parquet files, without its records in Python.

    write_step_rank(tr, path)        oracle.steps.step_rank_table, from the sweep per step range
                                     (step_sweep.build) and a pipeline run's bubble
                                     (pipeline_spans.figures), to Parquet
    step_rank_rows(table, tr)        its rows as oracle.steps.step_row's dicts (coords from `tr`)
    ranks_table(sr, tr)              oracle.steps.ranks_table
    step_times(sr)                   per step the slowest rank's step_s (stragglers' input)
    write_throughput(con, sr, ...)   oracle.steps.throughput_table (per step, to Parquet)
    trace_coverage(con, sr)          oracle.steps.trace_coverage

`sr`: the step_rank table as Arrow, in (rank, step) order. Figures are formed from the sweep's
integer ns exactly as oracle.steps.step_row forms them; sums over steps run left to
right (np.cumsum, as Python's sum), so the tables equal the oracle's (tests/analysis/
test_engine.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from jobs.trace_schedule import compact_ranges

from . import finished as F
from . import rules, step_sweep
from . import steps as S
from .storage.load import Traces

NS = 1e9
# step_row's keys the file holds (coords, pp, dp, tp come from the ranks' meta)
FLOATS = ("step_s", "compute_s", "comm_s", "overlap_s", "exposed_comm_s", "idle_s",
          "overlap_pct")
NULLS = ("bubble_s", "pipeline_window_s", "pipeline_idle_s")  # non-pipeline runs: None
PIPE = {"bubble_s": "bubble_ns", "pipeline_window_s": "window_ns",
        "pipeline_idle_s": "idle_ns"}  # their integer ns (pipeline_spans.figures)


def _chunk_table(c: dict) -> pa.Table:
    """One step range's step_rank columns from the sweep's integers (oracle.steps.step_row's
    arithmetic, vectorised: the same IEEE operations)."""
    span = c["t1"].astype(np.int64) - c["t0"].astype(np.int64)
    comm = c["comm_ns"].astype(np.int64)
    overlap = c["overlap_ns"].astype(np.int64)
    with np.errstate(divide="ignore", invalid="ignore"):
        pct = np.where(comm != 0, 100.0 * overlap / np.where(comm != 0, comm, 1), np.nan)
    cols = {"step": pa.array(c["step"], pa.int64()), "rank": pa.array(c["rank"], pa.int64()),
            "step_s": span / NS, "compute_s": c["compute_ns"] / NS, "comm_s": comm / NS,
            "overlap_s": overlap / NS, "exposed_comm_s": c["exposed_ns"] / NS,
            "idle_s": np.maximum(0, span - c["busy_ns"].astype(np.int64)) / NS,
            "overlap_pct": pa.array(pct, pa.float64(), mask=comm == 0),
            "comm_ops": pa.array(c["comm_ops"], pa.int64()),
            "has_step_span": pa.array(c["has_step"], pa.bool_())}
    for k in ("loss", "loss_weight"):
        v = c[k]
        cols[k] = pa.array(np.ma.getdata(v).astype(float), pa.float64(),
                           mask=np.ma.getmaskarray(v))
    for k in NULLS:  # None where the row has no pipeline window (every row off a pipeline)
        cols[k] = pa.array(c[PIPE[k]] / NS, pa.float64(), mask=~c["has_window"]) \
            if "has_window" in c else pa.nulls(len(span), pa.float64())
    return pa.table(cols)


def _with_bubble(c: dict, pipe: dict) -> dict:
    """The sweep's integers with a pipeline's figures (pipeline_spans.figures): the bubble taken
    out of exposed comm and added to busy (oracle.steps.step_row)."""
    x = pipe["comm_bubble_ns"]
    return {**c, **pipe, "exposed_ns": c["exposed_ns"] - x,
            "busy_ns": c["busy_ns"] + pipe["bubble_ns"] - x}


def _concat(chunks: list[dict]) -> dict:
    return {k: (np.ma.concatenate if isinstance(chunks[0][k], np.ma.MaskedArray)
                else np.concatenate)([c[k] for c in chunks]) for k in chunks[0]}


def write_step_rank(tr: Traces, path: Path, chunks=None, pipe=None) -> pa.Table | None:
    """oracle.steps.step_rank_table to `path` in (rank, step) order, its warning on tr.warnings;
    the table written (None: no row, no file). `chunks`: step_sweep.rows_of's dicts, read
    already (default: step_sweep.build over path's folder). `pipe`: the sweep's integers ->
    pipeline_spans.figures' (None: not a pipeline run)."""
    chunks = list(chunks if chunks is not None else step_sweep.build(Path(path).parent))
    if pipe is not None and chunks:
        c = _concat(chunks)
        fig = pipe(c)
        chunks = [c if fig is None else _with_bubble(c, fig)]
    parts = [_chunk_table(c) for c in chunks]
    parts = [p for p in parts if p.num_rows]
    if not parts:
        return None
    table = pa.concat_tables(parts)
    table = table.take(pc_sort(table, ("rank", "step")))
    missing = int((~table.column("has_step_span").to_numpy(zero_copy_only=False)).sum())
    if missing:
        tr.warnings.append(S.no_step_span(missing))
    pq.write_table(table, path)
    return table


def pc_sort(table: pa.Table, keys) -> pa.Array:
    import pyarrow.compute as pc
    return pc.sort_indices(table, [(k, "ascending") for k in keys])


def step_rank_rows(table: pa.Table, tr: Traces) -> list[dict]:
    """oracle.steps.step_row's dicts of step_rank rows (coords, pp, dp, tp from the ranks' meta)."""
    rows = table.to_pylist()
    coords = {r: tr.coords(r) for r in tr.ranks}
    for x in rows:
        c = coords.get(x["rank"]) or {}
        x.update(coords=c, pp=c.get("pp"), dp=c.get("dp"), tp=c.get("tp"))
    return rows


def _col(table, name, dtype=float) -> np.ndarray:
    """A column as numpy (None -> nan for floats); empty without the table."""
    if table is None:
        return np.zeros(0, dtype)
    return table.column(name).to_numpy(zero_copy_only=False).astype(dtype)


def _seq_sum(x) -> float:
    """Python's sum() of the values in order (np.cumsum adds left to right, as sum does;
    np.sum's pairwise order would differ in the last bits)."""
    return float(np.cumsum(x)[-1]) if len(x) else 0.0


def ranks_table(sr, tr: Traces) -> list[dict]:
    """oracle.steps.ranks_table: per rank over the steady steps, the means per step."""
    if sr is None:
        return []
    step, rank = _col(sr, "step", np.int64), _col(sr, "rank", np.int64)
    use = np.isin(step, np.asarray(rules.steady(np.unique(step).tolist()), np.int64))
    out = []
    for k in np.unique(rank[use]).tolist():
        m = use & (rank == k)
        n = int(m.sum())
        sums = {c: _seq_sum(np.nan_to_num(_col(sr, c)[m])) for c in S.SUMMED}
        row = {"rank": k, "coords": tr.coords(k), "steady_steps": n}
        row.update({f"{c[:-2]}_mean_s": sums[c] / n for c in S.SUMMED})
        if not (~np.isnan(_col(sr, "bubble_s")[m])).any():
            row["bubble_mean_s"] = None
        row["overlap_pct"] = 100.0 * sums["overlap_s"] / sums["comm_s"] \
            if sums["comm_s"] else None
        out.append(row)
    return out


def step_times(sr) -> pa.Table:
    """Per step, the slowest rank's step_s (columns step, step_s)."""
    if sr is None:
        return pa.table({"step": pa.array([], pa.int64()), "step_s": pa.array([], pa.float64())})
    return sr.group_by("step").aggregate([("step_s", "max")]).rename_columns(
        ["step", "step_s"])


_SCALARS = """
SELECT step, rank, TRY_CAST(json_extract(args, '$.step_s') AS DOUBLE) AS step_s,
       json_type(args, '$.step_s') IN ('DOUBLE', 'UBIGINT', 'BIGINT') AS numeric_s,
       loss, loss_weight
FROM t WHERE type = 'scalars' AND step >= 0 ORDER BY step, rank
"""


def write_throughput(con, sr, spec: dict | None, summary: dict | None, path: Path,
                     warnings: list[str] | None = None) -> int:
    """oracle.steps.throughput_table to `path` (by step); the row count (0: no file)."""
    sc = con.execute(_SCALARS).fetchnumpy()
    bad = F.unfinished_steps(_marks(sc, sr), warnings)
    sc_step = np.asarray(sc["step"], np.int64)
    tr_step = _col(sr, "step", np.int64)
    traced = np.unique(tr_step)
    # per step: the step_rank rows' step_s, and the scalars' of steps without any
    t_s = _col(sr, "step_s")
    numeric = np.ma.filled(np.ma.asarray(sc["numeric_s"]), False).astype(bool)
    extra = ~np.isin(sc_step, traced) & numeric & ~np.ma.getmaskarray(sc["step_s"])
    steps_all = np.concatenate([tr_step, sc_step[extra]])
    vals = np.concatenate([t_s, np.ma.getdata(sc["step_s"]).astype(float)[extra]])
    losses = list((summary or {}).get("loss") or [])
    first = 0  # the first step losses[] covers
    if losses:  # loss[i] is global step start_step + i (steps.throughput: one step axis)
        first = int((summary or {}).get("start_step") or 0)
        losses = [None] * first + losses
    else:
        traced_l = _traced_losses(sc if len(sc_step) else None, sr)
        losses = [traced_l.get(s) for s in range(max(traced_l) + 1)] if traced_l else []
    tokens = S.tokens_per_step(spec)
    keys = np.union1d(np.unique(steps_all), np.arange(first, len(losses), dtype=np.int64))
    keys = keys[~np.isin(keys, np.asarray(sorted(bad), np.int64))]  # not steps
    if not len(keys):
        return 0
    u, inv = np.unique(steps_all, return_inverse=True)
    mx = np.full(len(u), -np.inf)
    np.maximum.at(mx, inv, vals)
    cnt = np.bincount(inv, minlength=len(u))
    pos = np.searchsorted(u, keys)
    found = (pos < len(u)) & (u[np.minimum(pos, len(u) - 1)] == keys) if len(u) else \
        np.zeros(len(keys), bool)
    step_s = np.where(found, mx[np.minimum(pos, max(len(u) - 1, 0))] if len(u) else 0, np.nan)
    ranks = np.where(found, cnt[np.minimum(pos, max(len(u) - 1, 0))] if len(u) else 0, 0)
    loss = [losses[s] if s < len(losses) and isinstance(losses[s], int | float) else None
            for s in keys.tolist()]
    has = ~np.isnan(step_s)
    with np.errstate(divide="ignore", invalid="ignore"):
        tps = np.where(has & (step_s != 0), (tokens or 0) / np.where(has, step_s, 1), np.nan)
    table = pa.table({
        "step": pa.array(keys, pa.int64()),
        "step_s": pa.array(np.where(has, step_s, 0.0), pa.float64(), mask=~has),
        "ranks": pa.array(ranks, pa.int64()),
        "tokens": pa.array([tokens] * len(keys), pa.int64()),
        "tokens_per_s": pa.array(np.nan_to_num(tps), pa.float64(),
                                 mask=~(has & (step_s != 0)) | (not tokens)),
        "loss": pa.array([None if x is None else float(x) for x in loss], pa.float64()),
        "traced": pa.array(np.isin(keys, traced), pa.bool_())})
    pq.write_table(table, path)
    return table.num_rows


def _marks(sc, sr):
    """finished.step_marks of the columns: the step_rank rows', then the scalars'."""
    yield from zip(_col(sr, "step", np.int64).tolist(), _col(sr, "rank", np.int64).tolist(),
                   _col(sr, "has_step_span", bool).tolist(), strict=True)
    numeric = np.ma.filled(np.ma.asarray(sc["numeric_s"]), False).astype(bool) \
        & ~np.ma.getmaskarray(sc["step_s"])
    yield from zip(np.asarray(sc["step"], np.int64).tolist(),
                   np.asarray(sc["rank"], np.int64).tolist(), numeric.tolist(), strict=True)


def _traced_losses(sc, sr) -> dict[int, float]:
    """oracle.steps.traced_losses over the scalars (else the step_rank rows), by (step, rank)."""
    if sc is not None:
        step, rank = np.asarray(sc["step"], np.int64), np.asarray(sc["rank"], np.int64)
        loss, w = (np.ma.filled(np.ma.asarray(sc[k], float), np.nan)
                   for k in ("loss", "loss_weight"))
    else:
        if sr is None:
            return {}
        step, rank = _col(sr, "step", np.int64), _col(sr, "rank", np.int64)
        loss, w = _col(sr, "loss"), _col(sr, "loss_weight")
    order = np.lexsort((rank, step))  # the oracle adds in (step, rank) order
    step, loss, w = step[order], loss[order], w[order]
    keep = ~np.isnan(loss) & ~np.isnan(w) & (w != 0)
    step, loss, w = step[keep], loss[keep], w[keep]
    out: dict[int, float] = {}
    if not len(step):
        return out
    starts = np.flatnonzero(np.concatenate(([True], step[1:] != step[:-1])))
    ends = np.append(starts[1:], len(step))
    for s, a, b in zip(step[starts].tolist(), starts.tolist(), ends.tolist(), strict=True):
        v = ws = 0.0
        for i in range(a, b):  # left to right, as traced_losses adds
            v += float(w[i]) * float(loss[i])
            ws += float(w[i])
        if abs(ws - 1.0) < 1e-9:
            out[s] = v
    return out


def trace_coverage(con, sr) -> dict:
    """oracle.steps.trace_coverage: traced steps (any rank), steps with scalars, capped ranks."""
    traced = np.unique(_col(sr, "step", np.int64))
    sc = np.asarray(con.execute("SELECT DISTINCT step FROM t WHERE type = 'scalars' AND "
                                "step >= 0").fetchnumpy()["step"], np.int64)
    every = np.union1d(sc, traced)
    capped = sorted(r for (r,) in con.execute(
        "SELECT DISTINCT rank FROM t WHERE type = 'instant' AND name = 'trace_capped'"
    ).fetchall())
    return {"traced_steps": compact_ranges(traced.tolist()),
            "traced_step_count": len(traced), "steps": len(every),
            "untraced_step_count": len(np.setdiff1d(every, traced)), "capped_ranks": capped}
