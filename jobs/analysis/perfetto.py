"""The Perfetto (Chrome Trace Event Format) document of a converted run, streamed on request
from its columnar trace (`trace-rank*.parquet`), one rank at a time.

No run stores a whole-run Perfetto file any more: the document is as large as the traces, and
most runs are never exported. A download reads one rank's records from the Parquet files
(DuckDB, in file order), builds that rank's events with export.py's one event layout, and
sends them before it reads the next rank, so memory holds one rank's records, not the run's.
A rank of more than RANK_MAX_RECORDS records is refused before anything is sent (ValueError:
export a window instead, backend/services/gantt_columnar.py). The time origin is
`origin_ns`: the same one the window export and the large-run Gantt use.
"""

from __future__ import annotations

import itertools
from pathlib import Path

from .export import _events, _other, _window, document_chunks
from .storage import columnar
from .storage.jsonl import sort_key
from .storage.load import Traces

# records of one rank the whole-run export holds at once (about 1 KiB each as dicts); the
# default trace schedule caps a rank at 500,000 detailed records (jobs/trace_schedule.py)
RANK_MAX_RECORDS = 2_000_000


def column_stat(run_dir: Path, column: str, largest: bool) -> int | None:
    """The smallest (or largest) value of a column over every row group's statistics of the
    run's Parquet traces, without reading a row; None when no row group has statistics."""
    import pyarrow.parquet as pq
    vals = []
    for p in Path(run_dir).glob("trace-rank*" + columnar.SUFFIX):
        md = pq.read_metadata(p)
        idx = md.schema.to_arrow_schema().get_field_index(column)
        if idx < 0:
            continue
        for i in range(md.num_row_groups):
            st = md.row_group(i).column(idx).statistics
            if st is not None and st.has_min_max:
                vals.append(st.max if largest else st.min)
    return (max if largest else min)(vals) if vals else None


def origin_ns(run_dir: Path, meta: Traces) -> int:
    """The run's time origin (what load.Traces.t0_ns is for a run in memory): the earliest of
    the ranks' meta `t0_ns` and the first record's timestamp."""
    t0 = [m["t0_ns"] for m in meta.meta.values() if isinstance(m.get("t0_ns"), int)]
    first = column_stat(run_dir, "ts_ns", largest=False)
    ts = t0 + ([first] if first is not None else [])
    return min(ts) if ts else 0


def iter_perfetto_columnar(run_dir: Path, spec: dict | None = None, *,
                           window_ms: tuple[float, float] | None = None,
                           chunk: int = 2000):
    """export.iter_perfetto_json's document of the converted run in `run_dir`, read from its
    Parquet files rank by rank (`window_ms`: only the records overlapping it). ValueError
    (before the first byte) when a rank holds more than RANK_MAX_RECORDS records."""
    from . import trace_sql as V
    run_dir = Path(run_dir)
    meta = V.meta_only(run_dir)
    con = V.connect(run_dir)
    try:
        counts = dict(con.execute("SELECT rank, count(*) FROM t GROUP BY rank").fetchall())
        big = {r: n for r, n in counts.items() if n > RANK_MAX_RECORDS}
        if big:
            r, n = max(big.items(), key=lambda x: x[1])
            raise ValueError(f"rank {r} holds {n:,} trace records, more than one download "
                             f"builds at once ({RANK_MAX_RECORDS:,}): export a window "
                             "(t0_ms and t1_ms, ms from the trace start)")
        t0 = origin_ns(run_dir, meta)
        lo, hi = _window(t0, window_ms)
        yield from _stream(con, meta, t0, lo, hi, spec, window_ms, chunk)
    finally:
        con.close()


def _stream(con, meta: Traces, t0: int, lo, hi, spec, window_ms, chunk: int):
    events = itertools.chain.from_iterable(  # a rank's records are read when its turn comes
        _events(Traces(ranks={rank: _rank_records(con, rank)}, meta=meta.meta), t0, lo, hi)
        for rank in sorted(meta.ranks))
    yield from document_chunks(events, _other(meta, t0, spec, window_ms), chunk)


def _rank_records(con, rank: int) -> list[dict]:
    """One rank's records in the loader's order (by timestamp, file order among equals)."""
    assert isinstance(rank, int)  # from the files' names: no text reaches the SQL
    table = con.sql(f"SELECT * EXCLUDE (row) FROM t WHERE rank = {rank} ORDER BY row"
                    ).to_arrow_table()
    recs = columnar.records_of(table)
    recs.sort(key=sort_key)
    return recs
