"""The step_rank table vectorised (issue 19): DuckDB over the Parquet files, for runs without
pipeline actions (a pipeline's bubble windows stay in steps.py: `None`).

steps.step_row's interval algebra as one sweep per (rank, step) (SQL sorts the events,
numpy sums the segments): every interval becomes a +1 at its start and a -1 at its end on
one of three counters, A compute spans, B blocking
comm records (steps.is_blocking's rule), C all comm records; between two consecutive event
times the state is constant, so with the segment clipped to the step window [t0, t1]

    compute = A > 0 and B = 0      comm = C > 0
    overlap = compute and comm     exposed = comm and not compute     busy = compute or comm

and each figure is a sum of segment lengths: the same integers as steps.py's unions and
differences (tests/analysis/test_columnar.py compares the rows). Float figures are formed in
Python from those integers exactly as step_row forms them.
"""

from __future__ import annotations

from . import steps as S
from .load import Traces
from .vec_tables import in_args

NS = 1e9

_EVENTS = """
WITH g AS MATERIALIZED (
  SELECT rank, step, type, cat, ts_ns AS s, ts_ns + coalesce(dur_ns, 0) AS e, row,
         "async" AS is_async, bucket, "end" AS how, loss, loss_weight
  FROM t WHERE type IN ('span', 'comm') AND step BETWEEN $lo AND $hi),
win AS MATERIALIZED (
  SELECT rank, step,
         arg_min(s, (s, row)) FILTER (type = 'span' AND cat = 'step') AS ws,
         arg_min(e, (s, row)) FILTER (type = 'span' AND cat = 'step') AS we,
         arg_min(loss, (s, row)) FILTER (type = 'span' AND cat = 'step') AS loss,
         arg_min(loss_weight, (s, row)) FILTER (type = 'span' AND cat = 'step') AS loss_weight,
         count(*) FILTER (type = 'span' AND cat = 'step') > 0 AS has_step,
         min(s) AS xs, max(e) AS xe, count(*) FILTER (type = 'comm') AS comm_ops
  FROM g GROUP BY rank, step),
comp AS MATERIALIZED (SELECT rank, step, s, e FROM g WHERE type = 'span' AND cat IN ({cats})),
run AS (  -- per compute-span start, the latest end of the spans started so far (ties too)
  SELECT rank, step, s AS a, max(e) OVER (PARTITION BY rank, step ORDER BY s) AS mb
  FROM comp),
cm AS MATERIALIZED (
  SELECT g.rank, g.step, g.s, g.e,
         CASE WHEN g.is_async IS NOT NULL THEN NOT g.is_async
              WHEN g.bucket IS NOT NULL OR g.how IN ('wait', 'issue') THEN false
              ELSE coalesce(r.mb >= g.e, false) END AS blocking
  FROM g ASOF LEFT JOIN run r ON r.rank = g.rank AND r.step = g.step AND r.a <= g.s
  WHERE g.type = 'comm'),
ev AS (
  SELECT rank, step, s AS t, 1::TINYINT AS a, 0::TINYINT AS b, 0::TINYINT AS c
  FROM comp WHERE e > s
  UNION ALL SELECT rank, step, e, -1, 0, 0 FROM comp WHERE e > s
  UNION ALL SELECT rank, step, s, 0, 1, 0 FROM cm WHERE blocking AND e > s
  UNION ALL SELECT rank, step, e, 0, -1, 0 FROM cm WHERE blocking AND e > s
  UNION ALL SELECT rank, step, s, 0, 0, 1 FROM cm WHERE e > s
  UNION ALL SELECT rank, step, e, 0, 0, -1 FROM cm WHERE e > s)
SELECT rank, step, t, a, b, c FROM ev
"""

_WINDOWS = _EVENTS[:_EVENTS.index("comp AS MATERIALIZED")].rstrip().rstrip(",") + """
SELECT rank, step, coalesce(ws, xs) AS t0, coalesce(we, xe) AS t1, has_step, comm_ops, loss,
       loss_weight FROM win ORDER BY rank, step
"""


def _sweep(ev: dict, win: dict) -> list:
    """(compute, comm, overlap, exposed, busy) ns per window row, numpy arrays. `ev`: the
    events' columns (any order), `win`: the windows' (rank, step, t0, t1, ordered). The
    counters are running sums over the events sorted by (rank, step, t) (each group's deltas
    sum to 0, so one cumsum serves all); a segment runs from an event to the next one of its
    group, clipped to the step window."""
    import numpy as np
    kw = np.asarray(win["rank"], np.int64) << 32 | np.asarray(win["step"], np.int64)
    out = np.zeros((5, len(kw)), np.int64)
    if len(ev["t"]):
        ke = np.asarray(ev["rank"], np.int64) << 32 | np.asarray(ev["step"], np.int64)
        t = np.asarray(ev["t"], np.int64)
        order = _event_order(ke, t, kw)
        ke, t = ke[order], t[order]
        a, b, c = (np.cumsum(np.asarray(ev[k], np.int64)[order]) for k in "abc")
        w = np.searchsorted(kw, ke)  # every event's (rank, step) has a window row
        lo, hi = np.asarray(win["t0"], np.int64)[w], np.asarray(win["t1"], np.int64)[w]
        same = ke[1:] == ke[:-1]
        seg = np.where(same, np.clip(np.minimum(t[1:], hi[:-1]) - np.maximum(t[:-1], lo[:-1]),
                                     0, None), 0)
        seg = np.append(seg, 0)  # the last event opens no segment
        comp_on = np.append((a[:-1] > 0) & (b[:-1] == 0), False)
        comm_on = np.append(c[:-1] > 0, False)
        starts = np.flatnonzero(np.concatenate(([True], ~same)))
        for i, m in enumerate((comp_on, comm_on, comp_on & comm_on, comm_on & ~comp_on,
                               comp_on | comm_on)):
            out[i, w[starts]] = np.add.reduceat(seg * m, starts)
    return list(out)


def _event_order(ke, t, kw):
    """The events' order by (rank-step, time): one argsort of a packed int64 key (the
    window's index times the chunk's time span, plus the time) where it fits, else lexsort.
    The order among events of equal time does not matter: the segments between them are
    empty, and the counters after the last of them are the same sums."""
    import numpy as np
    t0, span = int(t.min()), int(t.max()) - int(t.min()) + 1
    if len(kw) * span < (1 << 62):
        return np.argsort(np.searchsorted(kw, ke).astype(np.int64) * span + (t - t0))
    return np.lexsort((t, ke))


FIELDS = ("step", "cat", "ts_ns", "dur_ns", "async", "bucket", "end", "loss", "loss_weight")


def applies(con) -> bool:
    """No pipeline action spans and no field the SQL needs hidden in args."""
    acts = ", ".join(f"'{a}'" for a in S.ACTIONS)
    if con.execute(f"SELECT count(*) FROM t WHERE type = 'span' AND action IN ({acts})"
                   ).fetchone()[0]:
        return False
    return not (in_args(con, "span", FIELDS) or in_args(con, "comm", FIELDS))


CHUNK_RECORDS = 2_000_000  # records per sweep: bounds the events held in numpy at once


def chunks(con):
    """Step ranges of about CHUNK_RECORDS records each (the files' row groups follow time,
    so a range reads only its own)."""
    n, s0, s1 = con.execute("SELECT count(*), min(step), max(step) FROM t "
                            "WHERE type IN ('span', 'comm') AND step >= 0").fetchone()
    if not n:
        return []
    k = max(1, -(-n // CHUNK_RECORDS))
    width = -(-(s1 - s0 + 1) // k)
    return [(a, min(s1, a + width - 1)) for a in range(s0, s1 + 1, width)]


def build(con):
    """Per step range, the columns (rank, step, t0, t1, has_step, comm_ops, loss,
    loss_weight, compute_ns, comm_ns, overlap_ns, exposed_ns, busy_ns) as numpy arrays
    ordered by rank and step."""
    cats = ", ".join(f"'{c}'" for c in S.COMPUTE_CATS)
    for lo, hi in chunks(con):
        p = {"lo": lo, "hi": hi}
        win = con.execute(_WINDOWS.format(cats=cats), p).fetchnumpy()
        sums = _sweep(con.execute(_EVENTS.format(cats=cats), p).fetchnumpy(), win)
        yield {**win, **dict(zip(SUMS, sums, strict=True))}


SUMS = ("compute_ns", "comm_ns", "overlap_ns", "exposed_ns", "busy_ns")


def _row(x: dict, coords: dict) -> dict:
    """A step_rank row (steps.step_row's keys) from one rank-step's integer figures."""
    span, comm_ns, overlap = x["t1"] - x["t0"], x["comm_ns"], x["overlap_ns"]
    return {"step": x["step"], "rank": x["rank"], "coords": coords,
            "pp": coords.get("pp"), "dp": coords.get("dp"), "tp": coords.get("tp"),
            "step_s": span / NS, "compute_s": x["compute_ns"] / NS,
            "comm_s": comm_ns / NS, "overlap_s": overlap / NS,
            "exposed_comm_s": x["exposed_ns"] / NS, "bubble_s": None,
            "pipeline_window_s": None, "pipeline_idle_s": None,
            "idle_s": max(0, span - x["busy_ns"]) / NS,
            "overlap_pct": 100.0 * overlap / comm_ns if comm_ns else None,
            "comm_ops": x["comm_ops"], "has_step_span": bool(x["has_step"]),
            "loss": x["loss"], "loss_weight": x["loss_weight"]}


def step_rank_table(con, tr: Traces) -> list[dict] | None:
    """steps.step_rank_table's rows (and its warning), or None for a pipeline run."""
    if not applies(con):
        return None
    rows, missing = [], 0
    for c in build(con):
        cols = {k: v.tolist() for k, v in c.items()}
        recs = [dict(zip(cols, vals, strict=True)) for vals in zip(*cols.values(), strict=True)]
        for x in recs:
            rows.append(_row(x, tr.coords(x["rank"])))
            missing += not x["has_step"]
    rows.sort(key=lambda r: (r["rank"], r["step"]))
    if missing:
        tr.warnings.append(f"{missing} (step, rank) pair(s) without a `step` span: window taken "
                           "from the extent of their records (an unfinished step)")
    return rows
