"""SQL over a run's trace: the DuckDB view `t` of its Parquet files (storage/columnar.py), the
ranks' meta from the footers, which fields hide in `args`, and the two small tables the engine
takes from one query each, without loading records into Python (the oracle's rows: tests/
analysis/test_columnar.py compares them):

    axis_bytes_table   oracle.collectives.axis_bytes_table
    mem_peaks          memory.measured (trace samples; the summary fallback stays in Python)

The collectives' instances are instances.py's (numpy over one step range at a time). Definitions
are not restated: the steady steps are rules.steady; SQL only groups, orders and sums. Floating
sums may differ from the Python loop's in the last bit (another summation order); integers and
maxima are exact.
"""

from __future__ import annotations

import json
import weakref
from pathlib import Path

from . import memory as M
from .storage import columnar
from .storage.load import _RANK_RE, Traces, check_meta

NS = 1e9


def meta_only(out_dir: Path) -> Traces:
    """A Traces holding the ranks' meta records only (what group keys and coordinates need),
    from the files' footers, no query (engine.meta_traces adds the loader's warnings and the
    summary)."""
    import pyarrow.parquet as pq
    tr = Traces()
    for path in sorted(Path(out_dir).glob("trace-rank*" + columnar.SUFFIX)):
        m = _RANK_RE.search(path.name)
        if m:
            md = pq.read_schema(path).metadata or {}
            meta = json.loads(md.get(columnar.META_KEY, b"{}"))
            check_meta(int(m.group(1)), meta, [])  # as the loader: wrong shapes dropped
            tr.meta[int(m.group(1))], tr.ranks[int(m.group(1))] = meta, []
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
    if not any(Path(out_dir).glob("trace-rank*" + columnar.SUFFIX)):  # no record at all
        con.register("t_none", columnar.arrow_schema().empty_table())
        con.execute("CREATE VIEW t AS SELECT *, 0::BIGINT AS row FROM t_none")
        return con
    glob = str(Path(out_dir) / ("trace-rank*" + columnar.SUFFIX)).replace("'", "''")
    con.execute(f"CREATE VIEW t AS SELECT *, file_row_number AS row FROM read_parquet('{glob}', "
                "file_row_number = true, union_by_name = true)")
    return con


def _register(con, name: str, cols: dict[str, list]) -> None:
    import pyarrow as pa
    con.register(name, pa.table(cols))


# connection -> args_keys' answer: the engine asks in_args eight times of one connection
_ARGS_KEYS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def args_keys(con) -> set[tuple[str, str]]:
    """(record type, field) of every field some record keeps in its args: one scan of the
    args column per connection (the connection's files do not change while it is open)."""
    keys = _ARGS_KEYS.get(con)
    if keys is None:
        keys = _ARGS_KEYS[con] = set(con.execute(
            "SELECT DISTINCT type, unnest(json_keys(args)) FROM t WHERE args IS NOT NULL"
        ).fetchall())
    return keys


def in_args(con, typ: str, fields) -> bool:
    """Whether a `typ` record holds one of `fields` in its args (a value of another type
    than its column's, columnar.to_columns): SQL cannot see it there."""
    keys = args_keys(con)
    return any((typ, f) in keys for f in fields)


COMM_FIELDS = ("ts_ns", "dur_ns", "step", "op", "axis", "group", "seq", "group_size",
               "payload_bytes", "bytes_sent", "bytes_recv", "backend_op", "phase", "bucket",
               "unit", "microbatch")


def axis_bytes_table(con, tr: Traces, out_dir: Path, sums: dict | None = None
                     ) -> list[dict]:
    """oracle.collectives.axis_bytes_table from axis_sums.axis_sums (`sums`: computed already, e.g.
    shared with the links table). A field kept in a record's args is read as missing
    (engine.hidden_fields)."""
    from . import axis_sums
    sums = sums if sums is not None else axis_sums.axis_sums(out_dir)
    rows = []
    for (rank, axis), v in sorted(sums["merged"].items()):
        n = v["steps"]
        rows.append({"rank": rank, "axis": axis, "coords": tr.coords(rank),
                     "bytes_sent": v["sent"], "bytes_recv": v["recv"],
                     "setup_bytes_sent": v["setup"], "steps": n,
                     "bytes_sent_per_step": v["sent"] / n if n else None,
                     "bytes_recv_per_step": v["recv"] / n if n else None})
    return rows


def _mem_cols(con) -> list[str]:
    have = {d[0] for d in con.execute("SELECT * FROM t LIMIT 0").description}
    return [k for k in M.PARTS if M.MEASURED_KEY.get(k, k) in have]


def mem_peaks(con) -> dict[int, dict] | None:
    """rank -> {component: peak} over the trace's `mem` samples (memory.measured's trace
    part: a rank without model-state samples goes through its summary fallback); None when a
    component hides in args. The run's peak memory is summed from these in the memory table
    (memory.peak_bytes), on both paths."""
    comps = _mem_cols(con)
    if in_args(con, "mem", [M.MEASURED_KEY.get(k, k) for k in M.PARTS]):
        return None
    sel = [f'max("{M.MEASURED_KEY.get(k, k)}")' for k in comps]
    rows = con.execute(f"SELECT rank, {', '.join(sel)} FROM t WHERE type = 'mem' "
                       "GROUP BY rank").fetchall() if sel else []
    return {rank: {k: max(0, int(v)) for k, v in zip(comps, vals, strict=False)
                   if v is not None} for rank, *vals in rows}
