"""A pipeline run's figures at scale (engine.py): what oracle.steps.step_row adds to the step_rank
rows of a run with pipeline actions, and pipeline.stage_times' inputs, over its Parquet files
(DuckDB reads the columns, numpy measures the intervals).

oracle.steps.step_row, per (rank, step) with its pipeline's window W = [w0, w1] (the first to last
F/B/W/BW action of that step on any rank of the pipeline, steps.pipeline_windows) and the
rank's compute R (the union of its compute spans of every step):

    pipe_idle = W - R          bubble = pipe_idle within the step's [t0, t1]
    exposed   = comm - compute - bubble          busy = compute | comm | bubble

The step's compute lies in R, so bubble and compute are disjoint: with X = |comm & bubble|
the sweep's figures (step_sweep, without the bubble) become exposed - X and busy + bubble - X.
Every measure is |I - R| of an interval I, from R's merged islands and their running length
(|R & (-inf, x]| by one searchsorted): integer ns, as steps.py's interval algebra.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from . import steps as S
from .storage import columnar
from .storage.load import _RANK_RE, Traces

ACTIONS_SQL = ", ".join(f"'{a}'" for a in S.ACTIONS)
_COMPUTE = ", ".join(f"'{c}'" for c in S.COMPUTE_CATS)


def windows(con, tr: Traces) -> dict[tuple, tuple[int, int]]:
    """steps.pipeline_windows from the action spans' extent per (rank, step)."""
    out: dict[tuple, tuple[int, int]] = {}
    for rank, step, a, b in con.execute(
            "SELECT rank, step, min(ts_ns), max(ts_ns + coalesce(dur_ns, 0)) FROM t "
            f"WHERE type = 'span' AND action IN ({ACTIONS_SQL}) AND step >= 0 "
            "GROUP BY rank, step").fetchall():
        key = (int(step), S.pipeline_key(tr.coords(int(rank))))
        w = out.get(key)
        out[key] = (a, b) if w is None else (min(w[0], a), max(w[1], b))
    return out


class Islands:
    """The union of intervals [s, e] as sorted disjoint islands, with `outside`: the length
    of an interval not covered by them."""

    def __init__(self, s: np.ndarray, e: np.ndarray):
        o = np.argsort(s, kind="stable")
        s, e = s[o], e[o]
        if not len(s):
            self.s = self.e = self.before = np.zeros(0, np.int64)
            return
        run = np.maximum.accumulate(e)
        new = np.concatenate(([True], s[1:] > run[:-1]))
        first = np.flatnonzero(new)
        self.s, self.e = s[first], run[np.append(first[1:] - 1, len(s) - 1)]
        self.before = np.concatenate(([0], np.cumsum(self.e - self.s)[:-1]))

    def upto(self, x: np.ndarray) -> np.ndarray:
        """|islands & (-inf, x]| per x."""
        if not len(self.s):
            return np.zeros(len(x), np.int64)
        j = np.searchsorted(self.s, x, side="right") - 1
        k = np.maximum(j, 0)
        got = self.before[k] + np.clip(x - self.s[k], 0, self.e[k] - self.s[k])
        return np.where(j >= 0, got, 0)

    def outside(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """|[a, b] - islands| per interval (0 where b <= a)."""
        b = np.maximum(a, b)
        return (b - a) - (self.upto(b) - self.upto(a))


def _int(x) -> np.ndarray:
    return np.asarray(x, np.int64)


def _rank_files(out_dir: Path) -> dict[int, str]:
    """rank -> its Parquet file, quoted for SQL (a rank's rows read from its own file: a
    filter on the view would open every rank's)."""
    out = {}
    for path in Path(out_dir).glob("trace-rank*" + columnar.SUFFIX):
        m = _RANK_RE.search(path.name)
        if m:
            out[int(m.group(1))] = "read_parquet('" + str(path).replace("'", "''") + "')"
    return out


def figures(con, tr: Traces, c: dict, out_dir: Path) -> dict | None:
    """Per step_rank row of `c` (arrays rank, step, t0, t1 from the sweep) of the run in
    `out_dir`: has_window, window_ns, idle_ns (pipe_idle), bubble_ns and comm_bubble_ns
    (X); None without action spans (not a pipeline run)."""
    wins = windows(con, tr)
    if not wins:
        return None
    rank, step, t0, t1 = (_int(c[k]) for k in ("rank", "step", "t0", "t1"))
    n = len(rank)
    keys = {r: S.pipeline_key(tr.coords(r)) for r in np.unique(rank).tolist()}
    w = [wins.get((s, keys[r])) for r, s in zip(rank.tolist(), step.tolist(), strict=True)]
    has = np.array([x is not None for x in w], bool)
    w0 = _int([x[0] if x else 0 for x in w])
    w1 = _int([x[1] if x else 0 for x in w])
    a, b = np.maximum(w0, t0), np.minimum(w1, t1)  # the window within the step's
    out = {"has_window": has, "window_ns": w1 - w0, **{k: np.zeros(n, np.int64) for k in (
        "idle_ns", "bubble_ns", "comm_bubble_ns")}}
    files = _rank_files(out_dir)
    for r in np.unique(rank[has]).tolist():
        rows = np.flatnonzero((rank == r) & has)
        spans = con.execute(
            f"SELECT ts_ns, ts_ns + coalesce(dur_ns, 0) AS e FROM {files[r]} WHERE "
            f"type = 'span' AND cat IN ({_COMPUTE})").fetchnumpy()
        busy = Islands(_int(spans["ts_ns"]), _int(spans["e"]))
        out["idle_ns"][rows] = busy.outside(w0[rows], w1[rows])
        out["bubble_ns"][rows] = busy.outside(a[rows], b[rows])
        out["comm_bubble_ns"][rows] = _comm_bubble(con, files[r], rows, step, a, b, busy)
    return out


def _comm_bubble(con, file: str, rows: np.ndarray, step, a, b, busy: Islands) -> np.ndarray:
    """Per row of `rows` (one rank's, with a window): |comm & [a, b] - R|, the union of the
    step's comm records within its clipped window not covered by the rank's compute."""
    cm = con.execute(f"SELECT step, ts_ns, ts_ns + coalesce(dur_ns, 0) AS e FROM {file} "
                     "WHERE type = 'comm' AND step >= 0").fetchnumpy()
    cs, s, e = _int(cm["step"]), _int(cm["ts_ns"]), _int(cm["e"])
    order = np.argsort(step[rows], kind="stable")
    srt = step[rows][order]
    pos = np.searchsorted(srt, cs)
    ok = (pos < len(srt)) & (srt[np.minimum(pos, len(srt) - 1)] == cs)
    g = order[pos[ok]]  # index into rows
    lo, hi = a[rows][g], b[rows][g]
    s, e = np.clip(s[ok], lo, hi), np.clip(e[ok], lo, hi)
    keep = e > s
    g, s, e = g[keep], s[keep], e[keep]
    # shift each row's window apart (gaps of 1 ns) so that one merge keeps rows apart
    width = np.maximum(b[rows] - a[rows], 0) + 1
    base = np.concatenate(([0], np.cumsum(width)[:-1]))
    shift = base - a[rows]
    isl = Islands(s + shift[g], e + shift[g])
    out = np.zeros(len(rows), np.int64)
    if len(isl.s):
        gi = np.searchsorted(base, isl.s, side="right") - 1
        np.add.at(out, gi, busy.outside(isl.s - shift[gi], isl.e - shift[gi]))
    return out


def stage_sums(con, steps: list[int]) -> list[tuple]:
    """(rank, action, stage, chunk, seconds summed, spans) of the action spans of `steps`:
    pipeline.stage_times' input (a span without a `stage` is placed by its chunk there)."""
    if not steps:
        return []
    keep = ", ".join(str(int(x)) for x in steps)
    return [(int(r), a, st, ch, float(ns) / S.NS, int(k)) for r, a, st, ch, ns, k in
            con.execute(
                "SELECT rank, action, stage, TRY_CAST(json_extract(args, '$.chunk') AS "
                "BIGINT), sum(dur_ns), count(*) FROM t WHERE type = 'span' AND action IN "
                f"({ACTIONS_SQL}) AND step IN ({keep}) GROUP BY ALL ORDER BY ALL").fetchall()]
