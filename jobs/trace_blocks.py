"""The flusher's columnar twin of the JSON lines (issue 19): `trace-rank{R}.blocks`, blocks
holding the same records as the lines, column by column, written after the lines (a block
per BLOCK_RECORDS flushed records, one at close, and one after IDLE_S without a record), so
the worker's conversion to Parquet decodes arrays instead of parsing JSON
(jobs/analysis/storage/blocks.py reads them; docs/trace-schema.md, "The flusher's blocks").

Standard library only (this module runs inside the job). A block:

    MAGIC | u32 header bytes | u64 body bytes | header (JSON) | body

The header says how many records the block holds (`n`), where the JSON file stood before and
after the flush's lines (`j0`, `j1`: the reader uses a block only while these chain from 0 to
the JSON file's size, so a block lost to a kill or a line written without one is noticed),
the block's distinct key tuples (`shapes`, in record key order), and per shape and key a
column: [kind, offset in the body, bytes]. Kinds:

    i  int64          f  float64        b  bool (one byte)      n  every value None
    s  int32 codes into the header's `strs`
    I F S B  the same, with None among the values: a byte per value first (1: present),
             then the values, a None stored as the type's zero
    j  the values as one JSON array, by the lines' encoder (anything else: mixed types,
       ints beyond int64, lists, dicts, objects the encoder turns into strings)

Records whose keys are not all strings (and any past MAX_SHAPES shapes) are one `j` column
of whole records (shape None).
The body starts with the records' shape ids (uint16, record order). Each kind decodes to what
`json.loads` of the record's line gives (`j` is that, the others its types exactly), so the
Parquet file a block converts into is the one the lines convert into.
"""

from __future__ import annotations

import json
import os
import struct
import sys
from array import array
from pathlib import Path

MAGIC = b"PLB1"
HEAD = struct.Struct("<4sIQ")  # magic, header bytes, body bytes
SUFFIX = ".blocks"
MAX_SHAPES = 1 << 16  # shape ids are uint16
# records per block: the flusher gathers its flushes' records until this many (and at
# close), so a block's fixed decoding cost (dozens of arrays) is spread over thousands
BLOCK_RECORDS = 1 << 13
# seconds without a new record after which the flusher writes its pending block: a hung rank
# (killed later, its close never run) keeps whole blocks; a step longer than this writes a
# block per step, still thousands of records for a model worth tracing that slowly
IDLE_S = 5.0


def blocks_path(jsonl: Path) -> Path:
    return Path(jsonl).with_suffix(SUFFIX)


_NONE = type(None)
_FILL = {int: 0, float: 0.0, str: "", bool: False}


def _column(vals: list, strs: dict, enc) -> tuple[str, bytes]:
    """(kind, bytes) of one shape's values of one key. One type and None (a `microbatch`
    outside a micro-batch) is the type's kind in upper case: a byte per value (1: present)
    before the values, a None stored as the type's zero."""
    kinds = set(map(type, vals))
    pre, col = b"", vals
    if len(kinds) == 2 and _NONE in kinds:
        kinds.discard(_NONE)
        t = next(iter(kinds))
        if t in _FILL:
            pre = bytes([v is not None for v in vals])
            fill = _FILL[t]
            col = [fill if v is None else v for v in vals]
        else:
            kinds.add(_NONE)
    if len(kinds) == 1:
        t = next(iter(kinds))
        kind = None
        if t is int:
            try:
                kind, buf = "i", array("q", col).tobytes()
            except OverflowError:  # beyond int64: the JSON array keeps it exact
                pass
        elif t is float:
            kind, buf = "f", array("d", col).tobytes()
        elif t is str:
            kind, buf = "s", array("i", [strs.setdefault(v, len(strs)) for v in col]).tobytes()
        elif t is bool:
            kind, buf = "b", bytes(col)
        elif t is _NONE:
            kind, buf = "n", b""
        if kind is not None:
            return (kind.upper(), pre + buf) if pre else (kind, buf)
    return "j", enc(vals).encode()


def encode(recs: list[dict], j0: int, j1: int, enc) -> bytes:
    """One block of `recs` (at most MAX_SHAPES distinct key tuples), whose lines took the JSON
    file from j0 to j1 bytes; `enc` is the lines' encoder (its `default` and separators)."""
    shapes: dict = {}
    rows: list[list[dict]] = []
    ids = array("H")
    for r in recs:
        k = tuple(r)
        s = shapes.get(k)
        if s is None:
            # whole records (shape None): a non-string key, whose JSON form is the encoder's,
            # or one shape too many for a uint16 id
            if len(rows) >= MAX_SHAPES - 1 or not all(type(x) is str for x in k):
                k = None
                s = shapes.get(k)
            if s is None:
                s = shapes[k] = len(rows)
                rows.append([])
        rows[s].append(r)
        ids.append(s)
    assert len(rows) <= MAX_SHAPES, len(rows)
    strs: dict[str, int] = {}
    body = [ids.tobytes()]
    at = len(body[0])
    cols = []
    for keys, rs in zip(shapes, rows, strict=True):
        out = []
        for k in (keys if keys is not None else (None,)):
            kind, buf = _column([r[k] for r in rs], strs, enc) if k is not None else \
                ("j", enc(rs).encode())
            out.append([kind, at, len(buf)])
            body.append(buf)
            at += len(buf)
        cols.append(out)
    head = enc({"n": len(recs), "j0": j0, "j1": j1, "order": sys.byteorder,
                "shapes": [list(k) if k is not None else None for k in shapes],
                "cols": cols, "strs": list(strs)}).encode()
    return HEAD.pack(MAGIC, len(head), at) + head + b"".join(body)


def read_blocks(f):
    """(header, body bytes) of each whole block of the binary file `f`, one at a time; stops
    at the first torn or foreign one (a kill mid-write leaves its block short)."""
    while len(raw := f.read(HEAD.size)) == HEAD.size:
        magic, hlen, blen = HEAD.unpack(raw)
        if magic != MAGIC:
            return
        head = f.read(hlen)
        body = f.read(blen)
        if len(head) != hlen or len(body) != blen:
            return
        try:
            head = json.loads(head)
        except ValueError:
            return
        yield head, body


def read_heads(f, at_too: bool = False):
    """The header of each whole block of the binary file `f` (with `at_too`: (its offset,
    header)), seeking over the bodies (the converter's check that the blocks chain, without
    reading them)."""
    size = os.fstat(f.fileno()).st_size
    at = 0
    while at + HEAD.size <= size:
        f.seek(at)
        magic, hlen, blen = HEAD.unpack(f.read(HEAD.size))
        end = at + HEAD.size + hlen + blen
        if magic != MAGIC or end > size:
            return
        try:
            head = json.loads(f.read(hlen))
        except ValueError:
            return
        yield (at, head) if at_too else head
        at = end
