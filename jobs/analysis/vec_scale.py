"""The vectorised tables of a converted run at scale, written to Parquet beside its traces
(what bench/analysis_speed.py times at 5 M and 50 M records): vec_steps' step_rank and
vec_tables' collectives instances streamed, the small tables returned as rows."""

from __future__ import annotations

from pathlib import Path

from . import vec_steps as VS
from .vec_tables import (
    COMM_FIELDS,
    _keys,
    axis_bytes_table,
    build_instances,
    connect,
    has_p2p,
    in_args,
    mem_peaks,
    meta_traces,
    peak_bytes,
)


def vector_tables(out_dir: Path, memory_limit: str | None = "1GB") -> dict:
    """Every vectorised table of a converted run, the per-record-scale ones (step_rank, the
    collectives' instances) left in DuckDB and written to Parquet beside the traces
    (`table-<name>.parquet`, streamed: memory stays bounded), the small ones returned as rows.
    What bench/analysis_speed.py times at 5 M and 50 M records."""
    out_dir = Path(out_dir)
    con = connect(out_dir, memory_limit)
    tr = meta_traces(out_dir)
    res: dict = {}
    if VS.applies(con):
        import pyarrow as pa
        import pyarrow.parquet as pq
        res["step_rank_rows"], writer = 0, None
        for c in VS.build(con):
            tab = pa.table({k: pa.array(v) for k, v in c.items()})
            if writer is None:
                writer = pq.ParquetWriter(out_dir / "table-step_rank.parquet", tab.schema)
            writer.write_table(tab)
            res["step_rank_rows"] += tab.num_rows
        if writer is not None:
            writer.close()
    if not has_p2p(con) and not in_args(con, "comm", COMM_FIELDS):
        _keys(con, tr)
        build_instances(con)
        res["collective_instances"] = _copy(con, "inst", out_dir / "table-collectives.parquet")
    res["axis_bytes"] = axis_bytes_table(con, tr)
    res["mem_peaks"] = mem_peaks(con)
    res["peak_bytes"] = peak_bytes(con)[0]
    return res


def _copy(con, table: str, path: Path) -> int:
    dest = str(path).replace("'", "''")
    con.execute(f"COPY {table} TO '{dest}' (FORMAT parquet, COMPRESSION zstd)")
    return con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
