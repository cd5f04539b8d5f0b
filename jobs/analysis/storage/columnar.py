"""Columnar trace storage: a run's `trace-rank{R}.jsonl` converted, when the run
ends, into `trace-rank{R}.parquet` (docs/trace-schema.md, "Columnar storage").

The JSON lines stay the live format (the flusher appends to them, so a cancelled or hung run
keeps its trace up to its last flush); the Parquet files are what analysis reads afterwards:
DuckDB queries them without loading records into Python (vec_*.py), and `load.load_run_dir`
rebuilds the same `Traces` from them for the Python tables.

Round trip: a field listed in COLUMNS whose value has the column's Python type is stored in
that column; anything else (other fields, other types, nested values, None) goes, JSON
encoded, into the `args` column, so `records_of` gives back the records `load.parse_lines`
produced, field for field (==). Two exceptions: an int in a float column (`bytes_recv: 8192`)
reads back as the equal float, and a null `microbatch` as present and None (every record of
the schema has it). Imports pyarrow lazily (jobs/summary.py imports
load.py inside the job process, which needs torch and the standard library only).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .jsonl import sort_key

COLUMNAR_SCHEMA = 1  # bump when COLUMNS or their meaning change
SUFFIX = ".parquet"
META_KEY = b"paralab.meta"  # the rank's `meta` record, JSON
SCHEMA_KEY = b"paralab.columnar_schema"
STATE_KEY = b"paralab.parse"  # {"bad": lines skipped, "empty": file had no line}
ORIGIN_KEY = b"paralab.origin"  # b"lines", b"blocks" or b"blocks+lines": what it came from

_INT, _FLOAT, _STR, _BOOL = "int64", "float64", "string", "bool"
# name -> type. Order is the files' column order; `rank` and `args` come first and last.
COLUMNS: dict[str, str] = {
    "type": _STR, "ts_ns": _INT, "dur_ns": _INT, "step": _INT, "microbatch": _INT,
    "name": _STR, "cat": _STR, "action": _STR, "stage": _INT, "loss": _FLOAT,
    "loss_weight": _FLOAT,
    "op": _STR, "axis": _STR, "group": _STR, "seq": _INT, "group_size": _INT,
    "payload_bytes": _INT, "bytes_sent": _FLOAT, "bytes_recv": _FLOAT, "peer": _INT,
    "is_root": _BOOL, "async": _BOOL, "end": _STR, "backend_op": _STR, "bucket": _INT,
    "unit": _INT, "layer": _INT, "region": _STR, "phase": _STR, "what": _STR, "source": _STR,
    "params": _INT, "grads": _INT, "optimizer": _INT, "activations": _INT, "grads_peak": _INT,
    "gathered": _INT, "gathered_peak": _INT, "comm_buffers": _INT, "recv_buffers": _INT,
    "rss_bytes": _INT, "cuda_allocated_bytes": _INT, "cuda_peak_allocated_bytes": _INT,
    "cuda_reserved_bytes": _INT, "reason": _STR,
}
_PYTYPE = {_INT: int, _FLOAT: float, _STR: str, _BOOL: bool}
_INT64 = 1 << 63
_EXACT = 1 << 53  # ints a float holds exactly
# rows per row group: a step range reads the groups its steps meet (step_ranges.py), so small
# groups waste little at a range's ends and one per rank file stays decoded between ranges
ROW_GROUP_ROWS = 1 << 16
NULL_IS_NONE = ("microbatch",)  # every record has it: a null reads back as None


class NotInt64(Exception):
    """A sort key numpy cannot hold exactly: the in-memory conversion orders the file."""


def sort_keys(np, recs: list[dict]):
    """The records' sort keys (jsonl.sort_key) as int64, or NotInt64."""
    ks = [sort_key(r) for r in recs]
    if any(type(k) is not int and type(k) is not bool for k in ks):
        raise NotInt64
    try:
        return np.array(ks, dtype=np.int64)
    except OverflowError:
        raise NotInt64 from None


POOL_ENV = "ARROW_DEFAULT_MEMORY_POOL"  # pyarrow reads it once, when it loads


def use_system_pool() -> None:
    """Arrow's buffers from the C library's allocator in this process, unless POOL_ENV chose
    one. pyarrow's default, mimalloc, asks for transparent huge pages, and on a kernel that
    compacts memory to give them (`defrag: madvise`, the usual setting) a long-lived buffer
    costs system time: decoding a 5 M-record run's row groups while holding them took 1.8 s
    of system time against 0.2 (the whole engine: 6.5 against 5.1 CPU s; the conversion
    4.6 against 4.3, 260 against 170 MB peak RSS; docs/benchmarks.md). Called where the
    conversion and the analysis start: before pyarrow loads, the variable sets its C++
    default too (the Parquet reader's and writer's buffers); after, the Python-level default
    only (measured: a quarter of the gain lost)."""
    import sys
    if os.environ.get(POOL_ENV) not in (None, "", "system"):
        return  # the user's choice
    os.environ[POOL_ENV] = "system"
    if "pyarrow" in sys.modules:
        import pyarrow as pa
        pa.set_memory_pool(pa.system_memory_pool())


def release_memory() -> None:
    """Hand the memory Arrow's pool has freed back to the system (the C library's allocator
    keeps it otherwise): after the engine's one read, 1.1 GiB of a 50 M-record run's
    1.6 GiB resident was freed but kept, and the tables after it grew the peak past 2 GiB."""
    import pyarrow as pa
    pa.default_memory_pool().release_unused()


def parquet_path(jsonl: Path) -> Path:
    return jsonl.with_suffix(SUFFIX)


def arrow_schema():
    import pyarrow as pa
    kinds = {_INT: pa.int64(), _FLOAT: pa.float64(), _STR: pa.string(), _BOOL: pa.bool_()}
    return pa.schema([("rank", pa.int32())] + [(k, kinds[t]) for k, t in COLUMNS.items()]
                     + [("args", pa.string())])


def utf8(s: str) -> bool:
    """Whether an Arrow string can hold `s`: not one with a lone surrogate (JSON's "\\ud800"
    decodes to one; UTF-8 has no encoding for it). Such a value goes to `args`, JSON-escaped,
    and reads back equal."""
    if s.isascii():
        return True
    try:
        s.encode()
    except UnicodeEncodeError:
        return False
    return True


def to_columns(recs: list[dict]) -> tuple[dict[str, list], list]:
    """Column lists (None where a record lacks the field or has another type, or is a string
    UTF-8 cannot hold) and args."""
    n = len(recs)
    cols = {k: [None] * n for k in COLUMNS}
    types = {k: _PYTYPE[t] for k, t in COLUMNS.items()}
    args: list = [None] * n
    for i, r in enumerate(recs):
        extra = None
        for k, v in r.items():
            t = types.get(k)
            if t is not None and type(v) is t and (t is not int or -_INT64 <= v < _INT64) \
                    and (t is not str or utf8(v)):
                cols[k][i] = v
            elif t is float and type(v) is int and -_EXACT <= v <= _EXACT:
                cols[k][i] = float(v)  # a byte count written as an int: equal as a float
            elif v is None and k in NULL_IS_NONE:
                continue  # the column's null
            elif k == "rank" and type(v) is int:
                continue  # the file's rank column
            else:
                if extra is None:
                    extra = {}
                extra[k] = v
        if extra:
            args[i] = json.dumps(extra)
    return cols, args


def rank_table(rank: int, recs: list[dict]):
    """The Arrow table (the schema, no file metadata) of records of one rank's file."""
    import pyarrow as pa
    schema = arrow_schema()
    cols, args = to_columns(recs)
    # a record whose rank field disagrees with the file keeps it in args (to_columns skipped
    # only int ranks): the column holds the file's rank
    for i, r in enumerate(recs):
        if type(r.get("rank")) is int and r["rank"] != rank:
            extra = json.loads(args[i]) if args[i] else {}
            extra["rank"] = r["rank"]
            args[i] = json.dumps(extra)
    arrays = [pa.array([rank] * len(recs), pa.int32())]
    arrays += [pa.array(cols[k], schema.field(k).type) for k in COLUMNS]
    arrays.append(pa.array(args, pa.string()))
    return pa.Table.from_arrays(arrays, schema=schema)


def write_rank(path: Path, rank: int, recs: list[dict], meta: dict, bad: int = 0,
               empty: bool = False, origin: str = "lines") -> None:
    """One rank's parsed records into `path` (atomically: written aside, then renamed)."""
    table = rank_table(rank, recs)
    write_table(table.replace_schema_metadata(file_metadata(meta, bad, empty, origin)), path)


def file_metadata(meta: dict, bad: int = 0, empty: bool = False,
                  origin: str = "lines") -> dict:
    """`origin`: what the file was converted from, the JSON `lines`, the flusher's `blocks`
    (jobs/trace_blocks.py), or `blocks+lines` (a killed rank's blocks and the lines after
    them): the same rows either way."""
    return {SCHEMA_KEY: str(COLUMNAR_SCHEMA).encode(), META_KEY: json.dumps(meta).encode(),
            STATE_KEY: json.dumps({"bad": bad, "empty": empty}).encode(),
            ORIGIN_KEY: origin.encode()}


# integers that grow record by record (records are in ts_ns order): delta-encoded, a tenth
# of their plain size or less before compression, and faster to decode than a dictionary
DELTA = ("ts_ns", "step", "seq")
# durations are nearly all distinct: a dictionary is tried, overflows and falls back, costing
# time and leaving its first pages larger (measured on a 625 k-record rank file: 30 against
# 16 ms, 1.47 against 0.95 MB for the column)
PLAIN = ("dur_ns",)
# the columns whose row-group min / max someone reads: `step` (step_ranges's step ranges),
# `ts_ns` and `dur_ns` (gantt_columnar's origin and longest span), `rank` and `type` (DuckDB's
# zone maps). The others' statistics cost a tenth of the write and nobody read them.
STATS = ("rank", "type", "ts_ns", "dur_ns", "step")


def write_options(names) -> dict:
    """The trace files' Parquet writer options (the converter's and the benchmark's): LZ4,
    DELTA columns delta-encoded, every other column but PLAIN's dictionary-encoded where it
    pays, statistics for STATS only. LZ4, not zstd (level 3 until 2026-12-04): a 625 k-record
    rank file writes in 194 against 244 ms and its scale-path columns decode in 71 against
    94 ms, for a file 3.4 against 2.6 MB (docs/benchmarks.md); the write is most of the
    conversion and nobody waits on the disk."""
    return {"compression": "lz4",
            "use_dictionary": [n for n in names if n not in DELTA and n not in PLAIN],
            "column_encoding": {n: "DELTA_BINARY_PACKED" for n in DELTA if n in names},
            "write_statistics": [n for n in STATS if n in names]}


def write_table(table, path: Path) -> None:
    import pyarrow.parquet as pq
    tmp = path.with_name(path.name + ".part")
    pq.write_table(table, tmp, row_group_size=ROW_GROUP_ROWS,
                   **write_options(table.schema.names))
    os.replace(tmp, path)


def read_rank(path: Path) -> tuple[list[dict], dict, int, bool]:
    """(records in file order, meta record, lines skipped, file was empty) of one rank."""
    import pyarrow.parquet as pq
    table = pq.read_table(path)
    md = table.schema.metadata or {}
    version = int(md.get(SCHEMA_KEY, b"0"))
    if version != COLUMNAR_SCHEMA:
        raise ValueError(f"{path.name}: columnar schema {version}, this reader knows "
                         f"{COLUMNAR_SCHEMA}")
    state = json.loads(md.get(STATE_KEY, b"{}"))
    meta = json.loads(md.get(META_KEY, b"{}"))
    recs = records_of(table)
    recs.sort(key=sort_key)  # stable: a no-op on a converted file
    return recs, meta, int(state.get("bad", 0)), bool(state.get("empty"))


def records_of(table) -> list[dict]:
    """The record dicts of a trace table (columns of COLUMNS, rank, args)."""
    names = [k for k in COLUMNS if k in table.column_names]
    data = {k: table.column(k).to_pylist() for k in names}
    ranks = table.column("rank").to_pylist()
    args = table.column("args").to_pylist()
    nulls = [k for k in NULL_IS_NONE if k in data]
    out = []
    for i, rank in enumerate(ranks):
        r = {"rank": rank}
        for k in names:
            v = data[k][i]
            if v is not None or k in nulls:
                r[k] = v
        if args[i]:
            r.update(json.loads(args[i]))
        out.append(r)
    return out


def has_columnar(out_dir: Path) -> bool:
    """Whether every trace-rank*.jsonl of the folder has an up-to-date Parquet twin (or the
    folder holds Parquet files only)."""
    out_dir = Path(out_dir)
    pq_files = list(out_dir.glob("trace-rank*" + SUFFIX))
    if not pq_files:
        return False
    for js in out_dir.glob("trace-rank*.jsonl"):
        p = parquet_path(js)
        try:
            if not p.is_file() or p.stat().st_mtime_ns < js.stat().st_mtime_ns:
                return False
        except OSError:
            return False
    return True
