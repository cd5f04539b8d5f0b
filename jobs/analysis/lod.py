"""Gantt level of detail over the Parquet trace files (issue 19): a time window cut into
`max_boxes` equal buckets; per (rank, lane, bucket) one box covering the records that start
in it. Whatever the run's length, a lane gets at most `max_boxes` boxes, and the query reads
only the row groups whose `ts_ns` range meets the window (Parquet statistics).

Lanes are those of the dashboard's Gantt (backend/gantt.py): `compute` (spans but `step`
ones and the phase spans), `sync` (spans of cat `comm` / `comm_wait`), `comm <axis>` (comm
records). A box: rank, lane, t0_ns / t1_ns (its records' extent clipped to the window), n
(records), name (the longest record's span name or op), dur_sum_ns (their durations inside
the window, summed: nested spans count twice), bytes (comm payload).
"""

from __future__ import annotations

from pathlib import Path

from .vec_tables import connect

COMPUTE, PHASES = "compute", "sync"
PHASE_CATS = ("comm", "comm_wait")

_Q = """
WITH r AS (
  SELECT rank,
         CASE WHEN type = 'comm' THEN 'comm ' || coalesce(axis, '?')
              WHEN cat IN ('comm', 'comm_wait') THEN '{phases}' ELSE '{compute}' END AS lane,
         coalesce(CASE WHEN type = 'comm' THEN op ELSE name END, '?') AS label,
         greatest(ts_ns, $lo) AS a, least(ts_ns + coalesce(dur_ns, 0), $hi) AS b,
         coalesce(payload_bytes, 0) AS nbytes
  FROM t
  WHERE (type = 'comm' OR (type = 'span' AND coalesce(cat, '') <> 'step'))
    AND ts_ns <= $hi AND ts_ns + coalesce(dur_ns, 0) >= $lo)
SELECT rank, lane, min(a) AS t0_ns, max(b) AS t1_ns, count(*) AS n,
       arg_max(label, b - a) AS name, sum(b - a) AS dur_sum_ns, sum(nbytes) AS bytes
FROM r
GROUP BY rank, lane, least(CAST(floor((a - $lo) / $width) AS BIGINT), $last)
ORDER BY rank, lane, t0_ns
"""


def window(con) -> tuple[int, int]:
    """(first record start, last record end) of the run in ns: the default window."""
    lo, hi = con.execute("SELECT min(ts_ns), max(ts_ns + coalesce(dur_ns, 0)) FROM t "
                         "WHERE ts_ns IS NOT NULL").fetchone()
    return int(lo or 0), int(hi or 0)


def gantt_boxes(out_dir: Path | None = None, *, con=None, t0_ns: int | None = None,
                t1_ns: int | None = None, max_boxes: int = 2000) -> list[dict]:
    """Boxes of every (rank, lane) in [t0_ns, t1_ns] (default: the whole run), at most
    `max_boxes` per lane. `con`: a vec_tables.connect connection (else one on out_dir)."""
    if max_boxes < 1:
        raise ValueError(f"max_boxes: must be >= 1, got {max_boxes}")
    con = con if con is not None else connect(Path(out_dir))
    lo, hi = window(con)
    lo = lo if t0_ns is None else int(t0_ns)
    hi = hi if t1_ns is None else int(t1_ns)
    if hi < lo:
        raise ValueError(f"t1_ns: the window ends ({hi}) before it starts ({lo})")
    width = max(1.0, (hi - lo) / max_boxes)
    cur = con.execute(_Q.format(phases=PHASES, compute=COMPUTE),
                      {"lo": lo, "hi": hi, "width": width, "last": max_boxes - 1})
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
