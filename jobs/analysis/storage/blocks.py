"""Reading the flusher's blocks (jobs/trace_blocks.py) into the converter's Arrow rows: the
same rows, in the same order, with the same sort keys, as parsing the JSON lines would give
(jsonl.scan, columnar.rank_table), without parsing them.

A shape (a key tuple of a block) whose every column maps onto the Parquet layout by type is
decoded as arrays: an int64 column of an int field, a float64 column of a float one (or of
ints within 2**53, as columnar.to_columns converts them), strings by their codes, bools, a
null `microbatch`; fields outside the layout, or of another type than their column's, go to
`args` as to_columns puts them there. Every other shape (a meta record, a `j` column of a
layout field, a `rank` other than the file's, an int beyond 2**53 in a float column, an
untimed span, a pre-issue-12 `optim`, keys that are not strings) is rebuilt as the records'
dicts and taken through the loader's own rule (jsonl.admit) and columnar.rank_table: rare,
and exact by construction. tests/analysis/test_blocks.py checks files from blocks against
files from lines.

`usable`: the blocks of a JSON file are read only when they are its twin: not older, and
their JSON offsets chain from 0 to the file's size. `prefix`: where they chain from 0 to a
point before the file's end (a rank killed between a flush's lines and its block: SIGKILL, a
hang's kill, the pending block never written), the blocks hold the lines up to that point
and the converter parses only the lines after it, when the last block's lines are its
records (the same count, the last one equal).
"""

from __future__ import annotations

import json
from pathlib import Path

from jobs import trace_blocks as TB

from . import columnar as C
from .jsonl import BAD, FIELD_TYPES, KEEP, META, TIMED, admit

_EXACT = 1 << 53


def usable(jsonl: Path) -> Path | None:
    """The blocks file twin of `jsonl`, or None (absent, older, or not its every line)."""
    bp = TB.blocks_path(jsonl)
    try:
        js, bs = jsonl.stat(), bp.stat()
        if bs.st_mtime_ns < js.st_mtime_ns:
            return None
        at = 0
        with open(bp, "rb") as f:
            for head in TB.read_heads(f):
                if head.get("j0") != at:
                    return None
                at = head.get("j1")
        return bp if at == js.st_size else None
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def prefix(jsonl: Path) -> tuple[Path, int] | None:
    """(blocks file, bytes of the lines they hold) when the blocks chain from 0 to a line end
    before the JSON file's end and their last block's lines are its records; else None."""
    bp = TB.blocks_path(jsonl)
    try:
        size = jsonl.stat().st_size
        at, last, where = 0, None, 0
        with open(bp, "rb") as f:
            for off, head in TB.read_heads(f, at_too=True):
                if head.get("j0") != at:
                    return None
                at, last, where = head.get("j1"), head, off
            if last is None or not isinstance(at, int) or not 0 < at < size:
                return None
            f.seek(where)  # the last whole block's body only
            _, body = next(TB.read_blocks(f))
        with open(jsonl, "rb") as f:
            f.seek(last["j0"])
            text = f.read(at - last["j0"])
        lines = [x for x in text.split(b"\n") if x.strip()]
        if not text.endswith(b"\n") or len(lines) != last["n"] or not lines:
            return None
        if _canon(json.loads(lines[-1])) != _canon(_last_record(last, body)):
            return None
        return bp, at
    except (OSError, ValueError, TypeError, AttributeError, KeyError, IndexError,
            StopIteration):
        return None


def _canon(r) -> str:
    return json.dumps(r, sort_keys=True)


def _last_record(head: dict, body: bytes):
    """The block's last record, as json.loads of its line gives it."""
    import numpy as np
    n = head["n"]
    bo = "<" if head["order"] == "little" else ">"
    ids = np.frombuffer(body, bo + "u2", n, 0)
    sid = int(ids[-1])
    keys, cols = head["shapes"][sid], head["cols"][sid]
    m = int((ids == sid).sum())
    if keys is None:
        return _values(np, head, body, cols[0], m)[-1]
    return {k: _pylist(head, c[0], _values(np, head, body, c, m), m)[-1]
            for k, c in zip(keys, cols, strict=True)}


def key_pass(bp: Path, rank: int, state: dict):
    """Pass 1 of a conversion from blocks: (file offset, int64 sort keys of its kept rows) of
    each block that keeps a record, in file order; `state` gets `meta`, `bad`, `seen` as the
    lines' scan would. Only the keys are decoded (pass 2, `table_at`, decodes a block when its
    rows are needed). Raises columnar.NotInt64 for a sort key numpy cannot hold."""
    with open(bp, "rb") as f:
        start = 0
        for head, body in TB.read_blocks(f):
            end = f.tell()
            if head["n"]:
                state["seen"] = True
            _, k = _block(head, body, rank, state, keys_only=True)
            if k is not None:
                yield start, k
            start = end


def table_at(f, offset: int, rank: int):
    """Pass 2: the Arrow rows (the layout, record order) of the block at `offset` of the open
    blocks file `f`: the rows whose keys key_pass gave."""
    f.seek(offset)
    head, body = next(TB.read_blocks(f))
    table, _ = _block(head, body, rank, {"meta": None, "bad": 0, "seen": True})
    return table


def _values(np, head: dict, body: bytes, col, m: int):
    """A column of m values: numpy (i, f, b: the values; s: int32 codes), (present mask,
    values) for an upper-case kind, None for n, a list for j."""
    kind, off, size = col
    if kind in "IFSB":
        valid = np.frombuffer(body, np.uint8, m, off).astype(bool)
        return valid, _values(np, head, body, (kind.lower(), off + m, size - m), m)
    bo = "<" if head["order"] == "little" else ">"
    if kind == "i":
        return np.frombuffer(body, bo + "i8", m, off)
    if kind == "f":
        return np.frombuffer(body, bo + "f8", m, off)
    if kind == "b":
        return np.frombuffer(body, np.uint8, m, off).astype(bool)
    if kind == "s":
        return np.frombuffer(body, bo + "i4", m, off)
    if kind == "n":
        return None
    return json.loads(body[off:off + size])


def _pylist(head: dict, kind: str, vals, m: int) -> list:
    """The values as json.loads of their lines gives them."""
    if kind in "IFSB":
        valid, vals = vals
        return [v if ok else None
                for v, ok in zip(_pylist(head, kind.lower(), vals, m), valid.tolist(),
                                 strict=True)]
    if kind == "n":
        return [None] * m
    if kind == "s":
        strs = head["strs"]
        return [strs[c] for c in vals.tolist()]
    return vals if isinstance(vals, list) else vals.tolist()


_COLKIND = {C._INT: "i", C._FLOAT: "f", C._STR: "s", C._BOOL: "b"}
_PYTYPE = {"i": int, "f": float, "s": str, "b": bool}


def _kind_is(kind: str, types: tuple) -> bool:
    """Whether every value of a column of this kind is None or an instance of `types`."""
    k = kind.lower()
    return k == "n" or (k in _PYTYPE and issubclass(_PYTYPE[k], types))


def _plan(head: dict, keys, cols, vals, rank: int):
    """For a fast shape: ({column: (values, present mask or None)}, [(args key, its kind)]);
    None for a slow one."""
    import numpy as np
    if keys is None or "type" not in keys:
        return None
    kinds = dict(zip(keys, (c[0] for c in cols), strict=True))
    if kinds["type"] != "s" or kinds.get("ts_ns", "i") != "i":
        return None  # another sort key than an int64 (or none): the lines' ordering rules
    strs = head["strs"]
    types = {strs[c] for c in np.unique(vals["type"]).tolist()}
    if "meta" in types:
        return None
    if types & set(TIMED):  # admit's timed rule, as arrays: int stamps, durations >= 0
        if "ts_ns" not in kinds or kinds.get("dur_ns", "i") != "i":
            return None
        if "dur_ns" in kinds and len(vals["dur_ns"]) and vals["dur_ns"].min() < 0:
            return None
        if "mem" in types and "optim" in kinds:
            return None
        # admit's typed fields (jsonl.FIELD_TYPES): a column of another kind takes the slow
        # path, where admit decides record by record
        for t in types & set(TIMED):
            for k, allowed in FIELD_TYPES[t].items():
                if k in kinds and not _kind_is(kinds[k], allowed):
                    return None
    put, extra = {}, []
    for k in keys:
        kind = kinds[k]
        if k == "rank":
            if kind != "i" or (vals[k] != rank).any():
                return None  # to_columns keeps another rank in args, last
            continue
        t = C.COLUMNS.get(k)
        if t is None:
            extra.append((k, kind))
        elif kind == "j":
            return None  # mixed types: each value routed by its own
        elif kind.isupper():  # some None: a column's null only where to_columns skips it
            if k not in C.NULL_IS_NONE or kind.lower() != _COLKIND[t]:
                return None
            valid, v = vals[k]
            put[k] = (v, valid)
        elif kind == _COLKIND[t]:
            put[k] = (vals[k], None)
        elif t == C._FLOAT and kind == "i":
            if ((vals[k] > _EXACT) | (vals[k] < -_EXACT)).any():
                return None
            put[k] = (vals[k].astype(np.float64), None)
        elif kind == "n" and k in C.NULL_IS_NONE:
            continue
        else:
            extra.append((k, kind))  # a uniform other type: args, as to_columns
    return put, extra


def _block(head: dict, body: bytes, rank: int, state: dict, keys_only: bool = False):
    """One block's rows (record order; None with `keys_only`) and sort keys; (None, None)
    when it keeps no record."""
    import numpy as np
    n = head["n"]
    bo = "<" if head["order"] == "little" else ">"
    ids = np.frombuffer(body, bo + "u2", n, 0)
    fast, slow = [], []  # (positions, values, plan) / (positions, records)
    # a string Arrow cannot hold (a lone surrogate): every shape is rebuilt as dicts, and
    # to_columns puts the string in args
    arrow_strs = all(map(C.utf8, head["strs"]))
    for s, (keys, cols) in enumerate(zip(head["shapes"], head["cols"], strict=True)):
        pos = np.flatnonzero(ids == s)
        m = len(pos)
        if not m:
            continue
        # JSON columns decoded only where their values are needed: a fast shape's are args
        vals = {} if keys is None else {k: _values(np, head, body, c, m)
                                         for k, c in zip(keys, cols, strict=True)
                                         if c[0] != "j"}
        plan = _plan(head, keys, cols, vals, rank) if arrow_strs else None
        if keys is not None and (plan is None or not keys_only):
            vals.update({k: _values(np, head, body, c, m)
                         for k, c in zip(keys, cols, strict=True) if c[0] == "j"})
        if plan is not None:
            fast.append((pos, vals, plan))
        elif keys is None:
            slow.append((pos, _values(np, head, body, cols[0], m)))
        else:
            lists = [_pylist(head, c[0], vals[k], m) for k, c in zip(keys, cols, strict=True)]
            slow.append((pos, [dict(zip(keys, row, strict=True))
                               for row in zip(*lists, strict=True)]))
    parts, places, keyparts = [], [], []
    if fast:
        pos = np.sort(np.concatenate([f[0] for f in fast]))
        slot = np.empty(int(pos[-1]) + 1, np.int64)
        slot[pos] = np.arange(len(pos))
        keys = np.zeros(len(pos), np.int64)  # a record without ts_ns sorts at 0 (sort_key)
        for p, _, (put, _) in fast:
            if "ts_ns" in put:
                keys[slot[p]] = put["ts_ns"][0]
        parts.append(None if keys_only else _fast_table(np, head, rank, slot, len(pos), fast))
        places.append(pos)
        keyparts.append(keys)
    if slow:
        recs, p = _slow_records(slow, state)
        if recs:
            parts.append(None if keys_only else C.rank_table(rank, recs))
            places.append(np.array(p, np.int64))
            keyparts.append(C.sort_keys(np, recs))
    if not keyparts:
        return None, None
    if len(keyparts) == 1:
        return parts[0], keyparts[0]
    order = np.argsort(np.concatenate(places), kind="stable")
    keys = np.concatenate(keyparts)[order]
    if keys_only:
        return None, keys
    import pyarrow as pa
    return pa.concat_tables(parts).take(pa.array(order)), keys


def _fast_table(np, head, rank, slot, F, fast):
    """The fast shapes' rows as the layout's arrays; `slot`: block position -> row."""
    import pyarrow as pa
    schema = C.arrow_schema()
    strs = pa.array(head["strs"], pa.string())
    data: dict[str, list] = {}
    args: list | None = None
    for p, vals, (put, extra) in fast:
        at = slot[p]
        for k, (v, valid) in put.items():
            data.setdefault(k, []).append((at, v) if valid is None else (at[valid], v[valid]))
        if extra:
            if args is None:
                args = [None] * F
            names = [k for k, _ in extra]
            lists = [_pylist(head, kind, vals[k], len(p)) for k, kind in extra]
            for i, row in zip(at.tolist(), zip(*lists, strict=True), strict=True):
                args[i] = json.dumps(dict(zip(names, row, strict=True)))
    arrays = [pa.array(np.full(F, rank, np.int32))]
    for k, t in C.COLUMNS.items():
        typ = schema.field(k).type
        got = data.get(k)
        if not got:
            arrays.append(pa.nulls(F, typ))
            continue
        valid = np.zeros(F, bool)
        if t == C._STR:
            codes = np.full(F, -1, np.int32)
            for at, v in got:
                codes[at] = v
                valid[at] = True
            arrays.append(strs.take(pa.array(codes, mask=~valid)))
            continue
        out = np.zeros(F, {C._INT: np.int64, C._FLOAT: np.float64, C._BOOL: bool}[t])
        for at, v in got:
            out[at] = v
            valid[at] = True
        arrays.append(pa.array(out, typ, mask=None if valid.all() else ~valid))
    arrays.append(pa.array(args if args is not None else [None] * F, pa.string()))
    return pa.Table.from_arrays(arrays, schema=schema)


def _slow_records(slow, state) -> tuple[list[dict], list[int]]:
    """The rebuilt records the loader's rule keeps, in record order, and their positions;
    metas and bad records go to `state` as the lines' scan counts them."""
    pairs = sorted((int(p), r) for pos, recs in slow
                   for p, r in zip(pos.tolist(), recs, strict=True))
    recs, places = [], []
    for p, r in pairs:
        assert isinstance(r, dict), type(r)  # a shape of whole records holds records only
        a = admit(r)
        if a is KEEP:
            recs.append(r)
            places.append(p)
        elif a is META:
            state["meta"] = r
        else:
            assert a is BAD
            state["bad"] += 1
    return recs, places
