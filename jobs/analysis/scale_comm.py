"""The tables built on the collectives at scale (issue 19): DuckDB SQL over the instances'
Parquet file (np_coll.instance_batches, written by write_instances), giving the rows of

    stragglers_table        stragglers.stragglers_table      (a pyarrow Table; straggler_rows)
    straggler_ranks_table   stragglers.straggler_ranks_table
    bandwidth_table         collectives.bandwidth_table
    links_table             links.links_table                (+ per-record bytes from `t`)

Definitions stay where they are: steady steps are rules.steady (in Python, over the distinct
steps), the thresholds rules.STRAGGLER_*, links links.link_of evaluated per distinct rank set /
(rank, axis) in Python. Medians are DuckDB's median, statistics.median's to 1 ulp (the
interpolation lo + (hi - lo) / 2 for an even count, not (lo + hi) / 2: see _MED). Waits are
summed in integer ns then divided: the oracle sums the float seconds, so sums agree to
rounding (1e-9 relative) and a per-step argmax could differ only on a tie the oracle's
rounding breaks.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from . import links as LK
from . import np_coll as N
from . import rules
from .load import Traces

NS = 1e9
_COLL = "op <> 'send_recv' AND step >= 0 AND n_ranks >= 2"  # stragglers._collective_rows
# statistics.median to the last bit: DuckDB's median (quantile_cont(0.5)) is lo + (hi - lo) / 2
# for an even count where statistics.median is (lo + hi) / 2. The exact (quantile_disc(x, 0.5)
# - quantile_disc(-x, 0.5)) / 2 costs 3x the time and 2x the memory at 13 M instances.
_MED = "CREATE MACRO med(x) AS median(x)"
# strings as dictionaries, statistics on `step` (what the readers filter on): the floats'
# dictionaries and statistics are write time spent for nothing
WRITE = {"compression": "snappy", "use_dictionary": ["op", "axis", "group", "backend_op",
                                                      "phase"], "write_statistics": ["step"]}


class InstanceWriter:
    """The instances' file written batch by batch (one row group per batch, each in the
    oracle's order: the file is by step range, then as collectives_table orders); `sample`:
    called with each batch as written (the scale path's Sampler of analysis.json's rows)."""

    def __init__(self, path: Path, sample=None):
        self.path, self.sample = Path(path), sample
        self.writer, self.n, self.incomplete = None, 0, 0

    def write(self, b: pa.Table) -> None:
        if self.writer is None:
            self.writer = pq.ParquetWriter(self.path, b.schema, **WRITE)
        b = b.take(N.sort_indices(b)).cast(self.writer.schema)
        self.writer.write_table(b)
        if self.sample is not None:
            self.sample(b)
        self.n += b.num_rows
        self.incomplete += b.num_rows - pc.sum(b["complete"]).as_py()

    def close(self, tr: Traces | None = None) -> int:
        """The file closed (none written without an instance); the count. `tr`: where
        collectives_table's incomplete-instances warning goes."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        if tr is not None:
            N.warn_incomplete(tr, self.incomplete)
        return self.n


def write_instances(tr: Traces, out_dir: Path, path: Path, sample=None,
                    passes=None) -> int:
    """np_coll.instance_batches of the run in `out_dir` (`passes`: its comm records per pass,
    when read already) streamed to `path` (InstanceWriter); the count. Appends
    collectives_table's incomplete-instances warning to tr.warnings. No file is written when
    there is no instance. Call only where np_coll.applies."""
    out = InstanceWriter(path, sample)
    try:
        for b in N.instance_batches(tr, out_dir, passes):
            out.write(b)
    except BaseException:
        out.close()  # what was written stays readable; the caller removes it
        raise
    return out.close(tr)


def _open(coll_path: Path):
    """A connection with view `c` over the instances and table `use` (the steady steps)."""
    con = duckdb.connect()
    con.execute("SET enable_progress_bar = false")
    p = str(coll_path).replace("'", "''")
    con.execute(f"CREATE VIEW c AS SELECT * FROM read_parquet('{p}')")
    con.execute(_MED)
    steps = [s for (s,) in con.execute("SELECT DISTINCT step FROM c WHERE step >= 0").fetchall()]
    con.register("use", pa.table({"step": pa.array(rules.steady(steps), pa.int64())}))
    return con


class Instances:
    """The instances' file with one connection over it (`_open`), opened on first use and
    shared by the tables below (each would open its own, a scan of the file's steps each)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._con = None

    def con(self):
        if self._con is None:
            self._con = _open(self.path)
        return self._con


def _path(coll) -> Path:
    return coll.path if isinstance(coll, Instances) else Path(coll)


def _con(coll):
    """The connection over the instances: `coll` an Instances or the file's path."""
    return coll.con() if isinstance(coll, Instances) else _open(coll)


def _dicts(cur) -> list[dict]:
    names = [d[0] for d in cur.description]
    return [dict(zip(names, t, strict=True)) for t in cur.fetchall()]


def stragglers_table(coll_path, step_s: pa.Table) -> pa.Table:
    """stragglers.stragglers_table as a table (one row per step, its columns the oracle's
    keys). step_s: columns step, step_s (the max over ranks of the step_rank rows)."""
    if not _path(coll_path).exists():
        return pa.table({k: [] for k in STRAGGLER_KEYS})
    con = _con(coll_path)
    con.register("ss", step_s)
    frac = rules.STRAGGLER_MIN_WAIT_FRACTION
    q = f"""
    WITH r AS (SELECT step, last_rank, wait_ns, clock_error_s FROM c WHERE {_COLL}),
    per AS (SELECT step, last_rank AS rank, sum(wait_ns) AS w, count(*) AS times
            FROM r GROUP BY ALL),
    best AS (SELECT *, row_number() OVER (PARTITION BY step ORDER BY w DESC, rank) AS k
             FROM per),
    clk AS (SELECT step, greatest(0.0, max(clock_error_s)) AS clock FROM r GROUP BY step),
    s AS (SELECT step, greatest(0.0, max(step_s)) AS step_s FROM ss GROUP BY step),
    x AS (SELECT b.step, b.rank, b.w / 1e9 AS caused, b.times, s.step_s, clk.clock
          FROM best b JOIN clk USING (step) LEFT JOIN s USING (step) WHERE b.k = 1)
    SELECT step, rank, caused AS caused_wait_s, times AS times_last, step_s,
           CASE WHEN step_s <> 0 THEN caused / step_s END AS wait_fraction,
           clock AS clock_error_s,
           coalesce(step_s <> 0 AND caused / step_s >= {frac!r} AND caused > clock, false)
             AS flagged
    FROM x ORDER BY step"""
    return con.sql(q).to_arrow_table()


STRAGGLER_KEYS = ("step", "rank", "caused_wait_s", "times_last", "step_s", "wait_fraction",
                  "clock_error_s", "flagged")


def straggler_rows(table: pa.Table) -> list[dict]:
    """stragglers_table's Table as the oracle's rows."""
    return table.select(list(STRAGGLER_KEYS)).to_pylist()


def straggler_ranks_table(coll_path, step_ranks) -> list[dict]:
    """stragglers.straggler_ranks_table; step_ranks: the ranks of the step_rank rows."""
    ranks = set(step_ranks)
    if not _path(coll_path).exists():
        return _rank_rows(ranks, {}, 0)
    con = _con(coll_path)
    ranks |= {k for (k,) in con.execute("SELECT DISTINCT unnest(ranks) FROM c").fetchall()}
    n = con.execute("SELECT count(*) FROM use").fetchall()[0][0]
    q = f"""
    WITH r AS (SELECT step, last_rank AS rank, late_ns, others_wait_ns FROM c
               WHERE {_COLL} AND step IN (SELECT step FROM use)),
    ps AS (SELECT rank, step, sum(late_ns) AS l FROM r GROUP BY ALL),
    a AS (SELECT rank, sum(l) AS late, list(l) FILTER (l > 0) AS ls FROM ps GROUP BY rank),
    o AS (SELECT rank, count(*) AS times, sum(others_wait_ns) AS others FROM r GROUP BY rank)
    SELECT rank, times, late, ls, others FROM a JOIN o USING (rank)"""
    return _rank_rows(ranks, {x["rank"]: x for x in _dicts(con.execute(q))}, n)


def _rank_rows(ranks: set, per: dict, n: int) -> list[dict]:
    total = sum(int(x["others"]) for x in per.values())
    rows = []
    for k in sorted(ranks):
        x = per.get(k) or {"times": 0, "late": 0, "ls": None, "others": 0}
        # a rank never last sums an empty dict in the oracle: the int 0
        tot, late = (int(x["late"]) / NS if k in per else 0), [v / NS for v in x["ls"] or []]
        others = int(x["others"]) / NS
        rows.append({"rank": k, "times_last": int(x["times"]), "late_s": tot,
                     "cost_per_step_s": tot / n if n else None, "late_steps": len(late),
                     "cost_median_s": statistics.median(late) if late else None,
                     "others_wait_s": others,
                     "wait_share": int(x["others"]) / total if total else None, "steps": n})
    return rows


_FILTER = "step IN (SELECT step FROM use) AND complete AND busbw_GBps IS NOT NULL"


def bandwidth_table(coll_path) -> list[dict]:
    """collectives.bandwidth_table."""
    if not _path(coll_path).exists():
        return []
    q = f"""
    SELECT op, coalesce(axis, 'None') AS axis, payload_bytes, group_size,
           count(*) AS instances, med(duration_s) AS duration_median_s,
           min(duration_s) AS duration_min_s, med(wait_s) AS wait_median_s,
           med(algbw_GBps) AS algbw_GBps,
           med(busbw_GBps) AS busbw_GBps
    FROM c WHERE {_FILTER} GROUP BY ALL ORDER BY op, axis, payload_bytes, group_size"""
    return _dicts(_con(coll_path).execute(q))


def links_table(con, tr: Traces, spec, coll_path, pred: dict | None,
                sums: dict) -> list[dict] | None:
    """links.links_table: per-record bytes from np_axis.axis_sums' `raw` sums (the axis_bytes
    table's), instance medians from coll_path; tr: vec_tables.meta_traces. None where a
    span's step / cat sits in args (the caller takes the Python path). A NULL axis and an
    axis named "?" on one rank would merge in the oracle's (rank, "?") and not here."""
    from .vec_tables import in_args
    if in_args(con, "span", ("step", "cat")):
        return None
    hosts, source = LK.rank_hosts(tr, spec)
    groups = LK._Groups(tr, spec)
    per: dict[tuple, dict] = {}
    for (rank, axis), v in sums["raw"].items():
        if not v["records"]:  # setup records only: no per-step bytes
            continue
        b, n = v["sent"], v["steps"]
        link = LK.link_of(groups.members(rank, {"axis": axis} if axis is not None else {}),
                          hosts)
        row = per.setdefault(("?" if axis is None else axis, link), {"ranks": set(),
                                                                     "per_step": []})
        row["ranks"].add(rank)
        row["per_step"].append(b / n if n else 0.0)
    inst: dict[tuple, tuple] = {}
    if _path(coll_path).exists():
        c = _con(coll_path)
        sets = c.execute(f"SELECT DISTINCT hash(ranks), ranks FROM c WHERE {_FILTER}").fetchall()
        c.register("lk", pa.table({"h": pa.array([h for h, _ in sets], pa.uint64()),
                                   "ranks": pa.array([r for _, r in sets], pa.list_(pa.int64())),
                                   "link": [LK.link_of(r, hosts) for _, r in sets]}))
        # joined on the lists' hash (an integer join: on the lists themselves it is 4x slower)
        # unless two distinct rank sets share one
        on = "lk.h = hash(c.ranks)" if len({h for h, _ in sets}) == len(sets) else \
            "lk.ranks = c.ranks"
        q = f"""SELECT coalesce(axis, 'None') AS axis, lk.link, count(*),
                       med(duration_s), med(busbw_GBps)
                FROM c JOIN lk ON {on} WHERE {_FILTER}
                GROUP BY ALL"""
        inst = {(a, lk): rest for a, lk, *rest in c.execute(q).fetchall()}
    theory = {x["axis"]: x for x in (((pred or {}).get("comm") or {}).get("links") or {})
              .get("per_axis", [])}
    rows = []
    for axis, link in sorted(set(per) | set(inst)):
        p = per.get((axis, link), {"ranks": set(), "per_step": []})
        cnt, dmed, bmed = inst.get((axis, link), (0, None, None))
        t = theory.get(axis, {})
        rows.append({
            "axis": axis, "link": link, "ranks": len(p["ranks"]), "instances": cnt,
            "bytes_sent_per_step": max(p["per_step"], default=None),
            "duration_median_s": dmed, "busbw_GBps": bmed,
            "hosts": len(set(hosts.values()) - {None}), "hosts_source": source,
            "predicted_link": t.get("link"), "predicted_bytes": t.get("bytes_per_rank"),
            "predicted_busbw_GBps": t.get("busbw_GBps"), "predicted_time_s": t.get("time_s"),
            "predicted_bandwidth_source": t.get("bandwidth_source")})
    return rows
