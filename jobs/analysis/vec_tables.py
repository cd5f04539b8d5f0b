"""Vectorised analysis (issue 19): DuckDB over a run's Parquet trace files (columnar.py).

Each function gives the rows of its Python counterpart (the oracle, tests/analysis/
test_columnar.py compares them) without loading records into Python:

    step_rank_table    steps.step_rank_table (vec_steps.py), for runs without pipeline actions
    collectives_table  collectives.collectives_table, for runs without point-to-point ops
                       (their FIFO matching and peer resolution stay in Python: `None`)
    axis_bytes_table   collectives.axis_bytes_table
    mem_peaks          memory.measured (trace samples; the summary fallback stays in Python)
    peak_bytes         memory.peak_bytes, where every rank's samples carry model state

Definitions are not restated: group membership is collectives.group_key evaluated in Python
once per (rank, axis), bus-bandwidth factors are jobs.commbytes.busbw_factor per (op, n), the
steady steps rules.steady; SQL only groups, orders and sums. Floating sums may differ from the
Python loop's in the last bit (another summation order); integers and maxima are exact.
"""

from __future__ import annotations

import json
from pathlib import Path

from jobs import commbytes

from . import collectives as C
from . import columnar
from . import memory as M
from .load import _RANK_RE, Traces

NS = 1e9


def meta_traces(out_dir: Path) -> Traces:
    """A Traces holding the ranks' meta records only (what group keys and coordinates need)."""
    import pyarrow.parquet as pq
    tr = Traces()
    for path in sorted(Path(out_dir).glob("trace-rank*" + columnar.SUFFIX)):
        m = _RANK_RE.search(path.name)
        if m:
            md = pq.read_schema(path).metadata or {}
            tr.meta[int(m.group(1))] = json.loads(md.get(columnar.META_KEY, b"{}"))
            tr.ranks[int(m.group(1))] = []
    return tr


def connect(out_dir: Path, memory_limit: str | None = None):
    """A DuckDB connection with view `t`: every rank's records, `row` their file order.
    `memory_limit` (e.g. "1GB"): DuckDB spills to a temporary folder beyond it."""
    import tempfile

    import duckdb
    con = duckdb.connect()
    con.execute("SET enable_progress_bar = false")
    if memory_limit:
        con.execute(f"SET memory_limit = '{memory_limit}'")
        con.execute("SET preserve_insertion_order = false")
        con.execute(f"SET temp_directory = '{tempfile.gettempdir()}/paralab-duckdb'")
    glob = str(Path(out_dir) / ("trace-rank*" + columnar.SUFFIX)).replace("'", "''")
    con.execute(f"CREATE VIEW t AS SELECT *, file_row_number AS row FROM read_parquet('{glob}', "
                "file_row_number = true, union_by_name = true)")
    return con


def _register(con, name: str, cols: dict[str, list]) -> None:
    import pyarrow as pa
    con.register(name, pa.table(cols))


def in_args(con, typ: str, fields) -> bool:
    """Whether a `typ` record holds one of `fields` in its args (a value of another type
    than its column's, columnar.to_columns): SQL cannot see it there, so the caller takes the
    Python path."""
    cond = " OR ".join(f"json_exists(args, '$.\"{f}\"')" for f in fields)
    return con.execute(f"SELECT count(*) FROM t WHERE type = '{typ}' AND args IS NOT NULL "
                       f"AND ({cond})").fetchone()[0] > 0


COMM_FIELDS = ("ts_ns", "dur_ns", "step", "op", "axis", "group", "seq", "group_size",
               "payload_bytes", "bytes_sent", "bytes_recv", "backend_op", "phase", "bucket",
               "unit", "microbatch")


def has_p2p(con) -> bool:
    ops = ", ".join(f"'{o}'" for o in commbytes.P2P_OPS)
    return con.execute(f"SELECT count(*) FROM t WHERE type = 'comm' AND op IN ({ops})"
                       ).fetchone()[0] > 0


def _keys(con, tr: Traces) -> None:
    """gk(rank, axis, gkey): collectives.group_key per (rank, axis) seen; bw(op, n, factor)."""
    pairs = con.execute("SELECT DISTINCT rank, coalesce(axis, '') FROM t WHERE type = 'comm'"
                        ).fetchall()
    ep = C.ep_of(tr)
    _register(con, "gk", {"rank": [r for r, _ in pairs], "axis": [a for _, a in pairs],
                          "gkey": [repr(C.group_key(tr, r, a, ep)) for r, a in pairs]})
    ops = con.execute("SELECT DISTINCT op, group_size FROM t WHERE type = 'comm' AND "
                      "group_size IS NOT NULL").fetchall()
    fac = []
    for op, n in ops:
        try:
            fac.append(float(commbytes.busbw_factor(op, int(n))))
        except ValueError:
            fac.append(None)
    _register(con, "bw", {"op": [o for o, _ in ops], "n": [n for _, n in ops], "factor": fac})
    err = {r: int(m.get("clock_error_ns") or 0) for r, m in tr.meta.items()}
    _register(con, "clk", {"rank": list(err), "err": list(err.values())})


# The comm records with their instance key, then the instances one hash partition of the
# keys at a time (an instance lies in one partition whole; each pass's aggregate fits in
# memory where 50 M records' at once would not).
_COMM = """
CREATE OR REPLACE TEMP TABLE c AS
SELECT t.rank, t.ts_ns, t.ts_ns + coalesce(t.dur_ns, 0) AS e, t.step, t.op, t.axis,
       t."group", t.seq, t.group_size, t.payload_bytes, t.backend_op, t.phase, t.bucket,
       t.unit, t.microbatch, t.bytes_sent, coalesce(t."group", coalesce(t.axis, '')) AS g,
       gk.gkey, (t.rank::BIGINT << 40) | t.row AS k, clk.err,
       hash(coalesce(t."group", coalesce(t.axis, '')), gk.gkey, t.seq) % $parts AS part
FROM t JOIN gk ON gk.rank = t.rank AND gk.axis = coalesce(t.axis, '')
LEFT JOIN clk ON clk.rank = t.rank
WHERE t.type = 'comm'
"""

_INSTANCES = """
WITH p AS MATERIALIZED (SELECT * FROM c WHERE part = $part),
a AS (
  SELECT min(k) AS first_key, arg_max(k, (ts_ns, rank)) AS last_key,
         count(*) AS parts, min(coalesce(step, -1)) AS step, list(rank) AS ranks,
         max(coalesce(bytes_sent, 0.0)) AS bytes_sent, min(ts_ns) AS start_ns,
         max(e) AS max_end, max(ts_ns) AS a_last, arg_max(ts_ns, (ts_ns, rank), 2) AS top2,
         sum(ts_ns::HUGEINT) AS a_sum, max(err) AS clock_err
  FROM p GROUP BY g, gkey, seq)
SELECT a.*, f.op, f.axis, f."group" AS grp, f.seq, f.group_size AS gsize,
       f.payload_bytes AS payload, f.backend_op, f.phase, f.bucket, f.unit, f.microbatch,
       l.rank AS last_rank, l.e AS e_last
FROM a JOIN p f ON f.k = a.first_key JOIN p l ON l.k = a.last_key
"""

PART_RECORDS = 1_000_000  # comm records per instance pass


def build_instances(con) -> None:
    """Temp table `inst`: one row per collective instance (gk, bw, clk registered)."""
    n = con.execute("SELECT count(*) FROM t WHERE type = 'comm'").fetchone()[0]
    parts = max(1, -(-n // PART_RECORDS))
    con.execute(_COMM, {"parts": parts})
    con.execute("DROP TABLE IF EXISTS inst")
    con.execute("CREATE TEMP TABLE inst AS " + _INSTANCES, {"part": 0})
    for i in range(1, parts):
        con.execute("INSERT INTO inst " + _INSTANCES, {"part": i})
    con.execute("DROP TABLE c")


_ROWS = """
SELECT i.*, greatest(e_last - a_last, 0) / 1e9 AS dur, bw.factor
FROM inst i LEFT JOIN bw ON bw.op = i.op AND bw.n = i.gsize
ORDER BY start_ns, coalesce(grp, 'None'), coalesce(seq, 0), first_key
"""


def collectives_table(con, tr: Traces) -> list[dict] | None:
    """collectives.collectives_table over the Parquet files; None with point-to-point ops.
    Appends the same incomplete-instances warning to tr.warnings."""
    if has_p2p(con) or in_args(con, "comm", COMM_FIELDS):
        return None
    _keys(con, tr)
    build_instances(con)
    cur = con.execute(_ROWS)
    names = [d[0] for d in cur.description]
    rows = []
    for tup in cur.fetchall():
        x = dict(zip(names, tup, strict=True))
        n = int(x["gsize"] or x["parts"])
        payload = int(x["payload"] or 0)
        dur, a_last = x["dur"], x["a_last"]
        row = {"step": x["step"], "op": x["op"] or "?", "axis": x["axis"], "group": x["grp"],
               "seq": x["seq"], "group_size": n, "ranks": sorted(x["ranks"]),
               "complete": x["parts"] >= n, "payload_bytes": payload,
               "bytes_sent": x["bytes_sent"], "backend_op": x["backend_op"],
               "start_ns": x["start_ns"], "last_rank": x["last_rank"],
               "wait_s": (a_last - x["start_ns"]) / NS,
               "late_s": (a_last - x["top2"][1]) / NS if x["parts"] > 1 else 0.0,
               "others_wait_s": int(a_last * (x["parts"] - 1) - (x["a_sum"] - a_last)) / NS,
               "duration_s": dur, "span_s": (x["max_end"] - x["start_ns"]) / NS,
               "clock_error_s": (x["clock_err"] or 0) / NS,
               "algbw_GBps": None, "busbw_GBps": None}
        if dur > 0 and payload:
            row["algbw_GBps"] = commbytes.algbw(payload, dur) / 1e9
            if x["factor"] is not None:
                row["busbw_GBps"] = commbytes.algbw(payload, dur) * x["factor"] / 1e9
        for k in ("phase", "bucket", "unit", "microbatch"):
            if x[k] is not None:
                row[k] = x[k]
        rows.append(row)
    incomplete = sum(not r["complete"] for r in rows)
    if incomplete:
        tr.warnings.append(f"{incomplete} communication instance(s) seen on fewer ranks than "
                           "their group size (missing ranks, or a cancelled run)")
    return rows


def axis_bytes_table(con, tr: Traces) -> list[dict] | None:
    """collectives.axis_bytes_table: per (rank, axis) sums; steps = the rank's `step` spans
    and its comm records' training steps. None: a field the SQL needs is in args."""
    if in_args(con, "comm", COMM_FIELDS) or in_args(con, "span", ("step", "cat")):
        return None
    q = """
    WITH c AS (SELECT rank, coalesce(axis, '?') AS axis, coalesce(step, -1) AS st,
                      coalesce(bytes_sent, 0.0) AS s, coalesce(bytes_recv, 0.0) AS r
               FROM t WHERE type = 'comm'),
    ss AS (SELECT DISTINCT rank, step AS st FROM t
           WHERE type = 'span' AND cat = 'step' AND coalesce(step, -1) >= 0),
    a AS (SELECT rank, axis, sum(s) FILTER (st >= 0) AS sent, sum(r) FILTER (st >= 0) AS recv,
                 sum(s) FILTER (st < 0) AS setup FROM c GROUP BY rank, axis),
    n AS (SELECT a.rank, a.axis, count(DISTINCT u.st) AS steps FROM a LEFT JOIN (
            SELECT rank, NULL AS axis, st FROM ss
            UNION ALL SELECT rank, axis, st FROM c WHERE st >= 0) u
          ON u.rank = a.rank AND (u.axis IS NULL OR u.axis = a.axis)
          GROUP BY a.rank, a.axis)
    SELECT a.rank, a.axis, coalesce(sent, 0.0), coalesce(recv, 0.0), coalesce(setup, 0.0),
           n.steps FROM a JOIN n USING (rank, axis) ORDER BY a.rank, a.axis"""
    rows = []
    for rank, axis, sent, recv, setup, n in con.execute(q).fetchall():
        rows.append({"rank": rank, "axis": axis, "coords": tr.coords(rank),
                     "bytes_sent": sent, "bytes_recv": recv, "setup_bytes_sent": setup,
                     "steps": n, "bytes_sent_per_step": sent / n if n else None,
                     "bytes_recv_per_step": recv / n if n else None})
    return rows


def _mem_cols(con) -> list[str]:
    have = {d[0] for d in con.execute("SELECT * FROM t LIMIT 0").description}
    return [k for k in M.STATE + M.EXTRA + ("gathered",) if M.MEASURED_KEY.get(k, k) in have]


def mem_peaks(con) -> dict[int, dict] | None:
    """rank -> {component: peak} over the trace's `mem` samples (memory.measured's trace
    part: a rank without model-state samples goes through its summary fallback)."""
    if in_args(con, "mem", [M.MEASURED_KEY.get(k, k) for k in M.STATE + M.EXTRA]):
        return None
    comps = [k for k in _mem_cols(con) if k != "gathered"]
    if not comps:
        return {}
    sel = ", ".join(f'max("{M.MEASURED_KEY.get(k, k)}")' for k in comps)
    out: dict[int, dict] = {}
    for rank, *vals in con.execute(f"SELECT rank, {sel} FROM t WHERE type = 'mem' "
                                   "GROUP BY rank").fetchall():
        out[rank] = {k: max(0, int(v)) for k, v in zip(comps, vals, strict=True)
                     if v is not None}
    return out


def peak_bytes(con) -> tuple[int | None, bool]:
    """(memory.peak_bytes' largest sample, whether every rank with mem samples has model-state
    samples): when not, the caller takes the Python path (its per-rank summary fallback)."""
    cols = _mem_cols(con)
    state = [k for k in M.STATE if k in cols]
    if not state or in_args(con, "mem", M.STATE + ("activations", "gathered")):
        return None, False
    total = " + ".join(f'coalesce("{k}", 0)' for k in M.STATE + ("activations", "gathered")
                       if k in cols)
    anyst = " OR ".join(f'"{k}" IS NOT NULL' for k in state)
    best, ranks_with, ranks_all = con.execute(
        f"SELECT max(CASE WHEN {anyst} THEN {total} END), "
        f"count(DISTINCT rank) FILTER ({anyst}), count(DISTINCT rank) FROM t").fetchone()
    return (int(best) if best is not None else None), ranks_with == ranks_all
