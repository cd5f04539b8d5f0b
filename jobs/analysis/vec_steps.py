"""The step_rank table vectorised (issue 19): DuckDB over the Parquet files, for runs without
pipeline actions (a pipeline's bubble windows stay in steps.py: `None`).

steps.step_row's interval algebra as one sweep per (rank, step): every interval becomes a
+1 at its start and a -1 at its end on one of three counters, A compute spans, B blocking
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

_BUILD = """
CREATE OR REPLACE TEMP TABLE sr AS
WITH g AS (
  SELECT rank, step, type, cat, ts_ns AS s, ts_ns + coalesce(dur_ns, 0) AS e, row,
         "async" AS is_async, bucket, "end" AS how, loss, loss_weight
  FROM t WHERE type IN ('span', 'comm') AND step >= 0),
win AS (
  SELECT rank, step,
         arg_min(s, (s, row)) FILTER (type = 'span' AND cat = 'step') AS ws,
         arg_min(e, (s, row)) FILTER (type = 'span' AND cat = 'step') AS we,
         arg_min(loss, (s, row)) FILTER (type = 'span' AND cat = 'step') AS loss,
         arg_min(loss_weight, (s, row)) FILTER (type = 'span' AND cat = 'step') AS loss_weight,
         count(*) FILTER (type = 'span' AND cat = 'step') > 0 AS has_step,
         min(s) AS xs, max(e) AS xe, count(*) FILTER (type = 'comm') AS comm_ops
  FROM g GROUP BY rank, step),
comp AS (SELECT rank, step, s, e FROM g WHERE type = 'span' AND cat IN ({cats})),
cm AS (
  SELECT g.rank, g.step, g.s, g.e,
         CASE WHEN g.is_async IS NOT NULL THEN NOT g.is_async
              WHEN g.bucket IS NOT NULL OR g.how IN ('wait', 'issue') THEN false
              ELSE EXISTS (SELECT 1 FROM comp c WHERE c.rank = g.rank AND c.step = g.step
                           AND c.s <= g.s AND g.e <= c.e) END AS blocking
  FROM g WHERE g.type = 'comm'),
ev AS (
  SELECT rank, step, s AS t, 1 AS a, 0 AS b, 0 AS c FROM comp WHERE e > s
  UNION ALL SELECT rank, step, e, -1, 0, 0 FROM comp WHERE e > s
  UNION ALL SELECT rank, step, s, 0, 1, 0 FROM cm WHERE blocking AND e > s
  UNION ALL SELECT rank, step, e, 0, -1, 0 FROM cm WHERE blocking AND e > s
  UNION ALL SELECT rank, step, s, 0, 0, 1 FROM cm WHERE e > s
  UNION ALL SELECT rank, step, e, 0, 0, -1 FROM cm WHERE e > s),
pt AS (SELECT rank, step, t, sum(a) AS a, sum(b) AS b, sum(c) AS c FROM ev
       GROUP BY rank, step, t),
st AS (
  SELECT rank, step, t,
         lead(t) OVER w AS t_next,
         sum(a) OVER w > 0 AS ca, sum(b) OVER w > 0 AS cb, sum(c) OVER w > 0 AS cc
  FROM pt WINDOW w AS (PARTITION BY rank, step ORDER BY t
                       ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)),
seg AS (
  SELECT st.rank, st.step, ca AND NOT cb AS comp_on, cc AS comm_on,
         greatest(0, least(t_next, coalesce(win.we, win.xe))
                     - greatest(t, coalesce(win.ws, win.xs))) AS len
  FROM st JOIN win USING (rank, step) WHERE t_next IS NOT NULL),
agg AS (
  SELECT rank, step,
         sum(len) FILTER (comp_on) AS compute_ns, sum(len) FILTER (comm_on) AS comm_ns,
         sum(len) FILTER (comp_on AND comm_on) AS overlap_ns,
         sum(len) FILTER (comm_on AND NOT comp_on) AS exposed_ns,
         sum(len) FILTER (comp_on OR comm_on) AS busy_ns
  FROM seg GROUP BY rank, step)
SELECT win.rank, win.step, coalesce(ws, xs) AS t0, coalesce(we, xe) AS t1, has_step,
       comm_ops, loss, loss_weight,
       coalesce(compute_ns, 0) AS compute_ns, coalesce(comm_ns, 0) AS comm_ns,
       coalesce(overlap_ns, 0) AS overlap_ns, coalesce(exposed_ns, 0) AS exposed_ns,
       coalesce(busy_ns, 0) AS busy_ns
FROM win LEFT JOIN agg USING (rank, step)
"""

FIELDS = ("step", "cat", "ts_ns", "dur_ns", "async", "bucket", "end", "loss", "loss_weight")


def applies(con) -> bool:
    """No pipeline action spans and no field the SQL needs hidden in args."""
    acts = ", ".join(f"'{a}'" for a in S.ACTIONS)
    if con.execute(f"SELECT count(*) FROM t WHERE type = 'span' AND action IN ({acts})"
                   ).fetchone()[0]:
        return False
    return not (in_args(con, "span", FIELDS) or in_args(con, "comm", FIELDS))


def build(con) -> None:
    """Temp table `sr`: the integer figures per (rank, step)."""
    con.execute(_BUILD.format(cats=", ".join(f"'{c}'" for c in S.COMPUTE_CATS)))


def step_rank_table(con, tr: Traces) -> list[dict] | None:
    """steps.step_rank_table's rows (and its warning), or None for a pipeline run."""
    if not applies(con):
        return None
    build(con)
    rows, missing = [], 0
    cur = con.execute("SELECT * FROM sr ORDER BY rank, step")
    names = [d[0] for d in cur.description]
    for tup in cur.fetchall():
        x = dict(zip(names, tup, strict=True))
        coords = tr.coords(x["rank"])
        span, comm_ns, overlap = x["t1"] - x["t0"], x["comm_ns"], x["overlap_ns"]
        missing += not x["has_step"]
        rows.append({"step": x["step"], "rank": x["rank"], "coords": coords,
                     "pp": coords.get("pp"), "dp": coords.get("dp"), "tp": coords.get("tp"),
                     "step_s": span / NS, "compute_s": x["compute_ns"] / NS,
                     "comm_s": comm_ns / NS, "overlap_s": overlap / NS,
                     "exposed_comm_s": x["exposed_ns"] / NS, "bubble_s": None,
                     "pipeline_window_s": None, "pipeline_idle_s": None,
                     "idle_s": max(0, span - x["busy_ns"]) / NS,
                     "overlap_pct": 100.0 * overlap / comm_ns if comm_ns else None,
                     "comm_ops": x["comm_ops"], "has_step_span": bool(x["has_step"]),
                     "loss": x["loss"], "loss_weight": x["loss_weight"]})
    if missing:
        tr.warnings.append(f"{missing} (step, rank) pair(s) without a `step` span: window taken "
                           "from the extent of their records (an unfinished step)")
    return rows
