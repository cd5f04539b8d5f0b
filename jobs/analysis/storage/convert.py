"""The post-run conversion of a run's JSON-lines traces into Parquet (columnar.py), in bounded
memory: a real-size rank file (millions of records) never becomes one list of dicts.

From the flusher's blocks (blocks.py, jobs/trace_blocks.py) where they are the lines' twin:
pass 1 decodes the blocks' sort keys, pass 2 decodes each block when a row group first needs
it (the blocks are the chunks below; no side file, no JSON parsed). Otherwise from the lines,
one rank file in two passes:
1. Chunks of CHUNK_LINES lines are parsed (jsonl.scan: the loader's line rules), turned into
   Arrow rows (columnar.rank_table) and appended to an uncompressed Arrow IPC file beside the
   output, in line order; only the records' sort keys (`ts_ns`, int64) stay in memory.
2. A stable argsort of the keys is the loader's order (records by ts_ns, ties in line order);
   the output's row groups are taken from the chunks their rows come from. The tracer appends
   a span when it ends, so a file is sorted but for spans displaced by their own length (a
   step span by one step): a row group meets the chunks its rows were written in and one or
   two beside, and a chunk is dropped after its last row group. Memory is then a constant
   (measured: ≈ 0.3 GiB peak for a 1.25 M-record file, 0.1 GiB of it before the second pass)
   plus ≈ 24 bytes a record (the int64 sort keys, kept, and the int32 order). A file out of
   order beyond MAX_LIVE chunks is taken from all its chunks at once (memory: its Arrow rows,
   a few times smaller than its dicts).
A file whose keys are not all int64 (a float stamp, a foreign `ts_ns`) takes the in-memory
path (parse, sort the dicts, write): the loader's ordering of mixed types, exactly.
The output equals the in-memory path's file, row for row and metadata for metadata
(tests/analysis/test_convert.py). While the run goes, the worker writes most of each rank's
file from its blocks already (convert_live.py); what is left is finished here."""

from __future__ import annotations

import logging
import os
from itertools import islice
from pathlib import Path

from jobs import trace_blocks as TB

from . import blocks as B
from . import columnar as C
from .jsonl import _RANK_RE, parse_file, scan

log = logging.getLogger(__name__)

# lines parsed at a time: 8 Ki lines (≈ 10 MB of dicts) measured both smaller and faster than
# 64 Ki (0.30 vs 0.44 GiB peak, 18.2 vs 21.2 CPU s for two 1.25 M-record files)
CHUNK_LINES = 1 << 13
MAX_LIVE = 128  # chunks held at once (1 Mi lines) before a file counts as out of order
# a file this small converts in memory, without the side file: its dicts take about ten times
# its size (~ 0.2 GB), and it is within a few chunks of lines
IN_MEMORY_BYTES = 16 << 20
# read the flusher's blocks where they are the lines' twin (False: the lines only, as before
# the blocks; the benchmark's side-by-side figure)
USE_BLOCKS = True
# the most lines after the blocks' last one that are parsed beside them (blocks.prefix: a
# rank killed before its pending block, at most a block's records, ~ 2 MB); more: the lines
TAIL_BYTES = IN_MEMORY_BYTES


def convert_run_dir(out_dir: Path, live=None) -> list[Path]:
    """Write `trace-rank{R}.parquet` beside every `trace-rank{R}.jsonl` of a run folder (torn
    and untimed lines skipped as the loader does; the count kept in the metadata). Returns
    the files written. Raises only on an unwritable folder. `live`: the run's
    convert_live.LiveRun, polled while it ran: a rank it finishes is not converted again."""
    C.use_system_pool()
    out = []
    try:
        for path in sorted(Path(out_dir).glob("trace-rank*.jsonl")):
            m = _RANK_RE.search(path.name)
            if not m:
                continue
            dest = C.parquet_path(path)
            if (live is not None and live.finish(int(m.group(1)))) or \
                    convert_rank(path, int(m.group(1)), dest):
                out.append(dest)
    finally:  # no live file is left behind, whatever happened
        if live is not None:
            live.close()
    return out


def convert_rank(path: Path, rank: int, dest: Path, blocks: bool | None = None) -> bool:
    """One rank file into `dest` (atomically); False when it cannot be read (the loader
    reports it from the JSON lines). From the flusher's blocks when they are the lines' twin
    (blocks.py), else from the lines; the blocks file is removed once `dest` is written (the
    Parquet file holds what it did). `blocks` False: the lines only, and nothing beside them
    touched (a copy of a run that is still written: the backend's scratch conversion);
    None: USE_BLOCKS."""
    use_blocks = USE_BLOCKS if blocks is None else blocks
    rows = dest.with_name(dest.name + ".rows")
    try:
        try:
            src = B.usable(path) if use_blocks else None
            tail = None
            if src is None and use_blocks and (pre := B.prefix(path)) is not None \
                    and path.stat().st_size - pre[1] <= TAIL_BYTES:
                src, tail = pre[0], (path, pre[1])  # a killed rank's: its lines after them
            if src is not None:
                try:
                    _from_blocks(src, rank, dest, tail)
                    return True
                except (C.NotInt64, OSError):
                    raise
                except Exception:  # noqa: BLE001 - a block that does not decode: the lines
                    log.warning("%s: blocks not decoded, converting the lines", src,
                                exc_info=True)
            if path.stat().st_size > IN_MEMORY_BYTES:
                _streamed(path, rank, dest, rows)
                return True
        except (C.NotInt64, OSError):
            pass  # OSError: the in-memory path's parse says whether the file can be read
        parsed = parse_file(path, rank)
        if parsed is None:
            return False
        C.write_rank(dest, rank, *parsed)
        return True
    finally:  # a failed conversion leaves no half-written file behind
        rows.unlink(missing_ok=True)
        dest.with_name(dest.name + ".part").unlink(missing_ok=True)
        if use_blocks and dest.exists():  # read or found stale: the Parquet file stands
            TB.blocks_path(path).unlink(missing_ok=True)


def _streamed(path: Path, rank: int, dest: Path, rows: Path) -> None:
    """Pass 1 (chunks of lines into `rows`, their sort keys kept), then pass 2."""
    import numpy as np
    import pyarrow as pa
    state = {"meta": {}, "bad": 0, "seen": False}
    keys, sizes = [], []
    with open(path, errors="replace") as f, pa.OSFile(str(rows), "wb") as sink, \
            pa.ipc.new_file(sink, C.arrow_schema()) as ipc:
        for k, table in _line_chunks(np, f, rank, state):
            keys.append(k)
            sizes.append(len(k))
            ipc.write_table(table)
    if _empty(rank, dest, state, keys, "lines"):
        return
    # read, not memory-mapped: a dropped chunk's memory goes back (mapped pages would count
    # in the worker's RSS up to the whole file)
    with pa.OSFile(str(rows)) as src:
        reader = pa.ipc.open_file(src)
        _write_sorted(np, lambda c: pa.Table.from_batches([reader.get_batch(c)]), keys,
                      sizes, C.file_metadata(state["meta"], state["bad"], not state["seen"],
                                             "lines"), dest)


def _from_blocks(src: Path, rank: int, dest: Path,
                 tail: tuple[Path, int] | None = None) -> None:
    """Pass 1 decodes the blocks' sort keys only (blocks.key_pass); pass 2 decodes each block
    when a row group first needs it: no side file, the blocks are the chunks. `tail`: (the
    JSON file, a byte offset) whose lines from there on follow the blocks (blocks.prefix),
    parsed by the loader's rule into chunks after theirs (origin `blocks+lines`)."""
    import numpy as np
    state = {"meta": {}, "bad": 0, "seen": False}
    offsets, keys, sizes = [], [], []
    for off, k in B.key_pass(src, rank, state):
        offsets.append(off)
        keys.append(k)
        sizes.append(len(k))
    nb = len(offsets)
    tails = _tail(np, *tail, rank, state, keys, sizes) if tail is not None else []
    origin = "blocks" if tail is None else "blocks+lines"
    if _empty(rank, dest, state, keys, origin):
        return

    with open(src, "rb") as f:
        def chunk(c: int):
            t = B.table_at(f, offsets[c], rank) if c < nb else tails[c - nb]
            assert t.num_rows == sizes[c], (c, t.num_rows, sizes[c])  # the keys' rows
            return t
        _write_sorted(np, chunk, keys, sizes, C.file_metadata(
            state["meta"], state["bad"], not state["seen"], origin), dest)


def _tail(np, path: Path, at: int, rank: int, state: dict, keys: list, sizes: list) -> list:
    """The Arrow rows of the lines of `path` from byte `at` on, chunk by chunk (their keys and
    sizes appended to `keys`, `sizes`)."""
    import io
    with open(path, "rb") as f:
        f.seek(at)
        data = f.read()
    out = []
    # read as the lines' reader opens a file (text mode, universal newlines, errors replaced)
    for k, table in _line_chunks(np, io.TextIOWrapper(io.BytesIO(data), errors="replace"),
                                 rank, state):
        keys.append(k)
        sizes.append(len(k))
        out.append(table)
    return out


def _line_chunks(np, f, rank: int, state: dict):
    """(int64 sort keys, Arrow rows) of each chunk of CHUNK_LINES lines of the open text file
    `f` that keeps a record (jsonl.scan: the loader's line rules); metas, bad and non-blank
    lines counted into `state`."""
    while lines := list(islice(f, CHUNK_LINES)):
        recs: list[dict] = []
        m, b, s = scan(lines, recs)
        if m is not None:
            state["meta"] = m
        state["bad"] += b
        state["seen"] = state["seen"] or s
        if recs:
            yield C.sort_keys(np, recs), C.rank_table(rank, recs)


def _empty(rank: int, dest: Path, state: dict, keys: list, origin: str) -> bool:
    """No record kept (metas, bad lines or nothing at all): the file without rows."""
    if keys:
        return False
    C.write_rank(dest, rank, [], state["meta"], state["bad"], not state["seen"], origin)
    return True


def _write_sorted(np, chunk, keys: list, sizes: list, md: dict, dest: Path) -> None:
    """The rows of chunks `chunk(c)` (of `sizes` rows, sort keys `keys`) into `dest` in key
    order."""
    import pyarrow.parquet as pq
    R = C.ROW_GROUP_ROWS
    keys, sizes = np.concatenate(keys), np.array(sizes)
    # int32 positions (a rank file holds < 2**31 records): with the keys, the per-record
    # arrays are what grows with the file here
    order = np.argsort(keys, kind="stable").astype(np.int32)
    del keys
    starts = np.concatenate([[0], np.cumsum(sizes)])
    pos = np.empty(len(order), np.int32)  # record -> its place in the output
    pos[order] = np.arange(len(order), dtype=np.int32)
    first = np.minimum.reduceat(pos, starts[:-1]) // R  # the groups that need a chunk
    last = np.maximum.reduceat(pos, starts[:-1]) // R
    del pos
    ngroups = -(-len(order) // R)
    live = np.zeros(ngroups + 1, np.int64)
    np.add.at(live, first, 1)
    np.add.at(live, last + 1, -1)
    spread = int(np.cumsum(live).max())  # the most chunks held at once
    part = dest.with_name(dest.name + ".part")
    schema = C.arrow_schema().with_metadata(md)
    with pq.ParquetWriter(part, schema, **C.write_options(schema.names)) as w:
        groups = (order[g * R:(g + 1) * R].astype(np.int64) for g in range(ngroups))
        if spread > MAX_LIVE:  # out of order: every chunk at once, once
            whole = [_all_chunks(chunk, len(sizes))]
            for idx in groups:
                w.write_table(take_rows(whole, idx), row_group_size=R)
        else:
            for table in _near(np, chunk, groups, starts, sizes, last):
                w.write_table(table, row_group_size=R)
    os.replace(part, dest)


def _near(np, chunk, groups, starts, sizes, last):
    """Each group's rows, taken from the chunks they are in; a chunk is read once, when a group
    first needs it, and dropped after `last[chunk]`, the last group that does."""
    import pyarrow as pa
    held: dict[int, pa.Table] = {}
    for g, idx in enumerate(groups):
        cs = np.searchsorted(starts, idx, side="right") - 1  # each row's chunk
        touched = np.unique(cs)
        for c in touched.tolist():
            if c not in held:
                held[c] = chunk(c)
        # the touched chunks side by side: a row's place is its chunk's base + its offset
        base = np.zeros(len(sizes), np.int64)
        base[touched] = np.concatenate([[0], np.cumsum(sizes[touched])[:-1]])
        yield take_rows([held[c] for c in touched.tolist()], base[cs] + idx - starts[cs])
        for c in touched[last[touched] == g].tolist():
            del held[c]
    assert not held, sorted(held)  # every chunk was dropped after its last group


def take_rows(tables: list, idx):
    """The rows `idx` of the tables side by side. A column null in every table is not taken
    but made (pa.nulls): most of the layout's columns are null in a given run's records, and
    taking them was most of the take (measured: 22 against 9 ms a 64 Ki-row group)."""
    import pyarrow as pa
    schema = tables[0].schema
    idx = pa.array(idx)
    cols = []
    for j, field in enumerate(schema):
        parts = [t.column(j) for t in tables]
        if all(p.null_count == len(p) for p in parts):
            cols.append(pa.nulls(len(idx), field.type))
        else:
            cols.append(pa.chunked_array([c for p in parts for c in p.chunks],
                                         field.type).take(idx))
    return pa.Table.from_arrays(cols, schema=schema)


def _all_chunks(chunk, n: int):
    import pyarrow as pa
    return pa.concat_tables([chunk(c) for c in range(n)]).combine_chunks()
