"""The collectives table at scale: oracle.collectives.collectives_table's instances from a
run's Parquet files, read by step_ranges (the rows of one step range, decoded once for the step
sweep, the axis sums and this), numpy for the rest.

Per pass (the setup records, step NULL or < 0, then each step_ranges step range) the comm
records' columns as Arrow (comm_table); an integer instance key packs (group-or-axis, group_key,
seq) (strings dictionary-encoded, collectives.group_key evaluated once per (rank, axis)); one
sort by (instance, rank, file row) makes each instance a segment whose first record is the
oracle's `first` (match() appends ranks in order, records in file order) and whose ranks are
already sorted; np.*.reduceat gives the minima, maxima and sums.

Pass boundaries: the oracle keys an instance by (group, group_key, seq) only, so one whose
records lie in two step ranges would split. An instance still incomplete (fewer records than
its group size) after its pass whose records reach the pass's last step (or any incomplete
setup instance) is carried into the next pass with its records, so an op straddling a range
boundary by one step stays whole; what remains unhandled is a complete-looking instance with
more records further on, or one skipping a whole step: neither a tracer writes.

Like trace_sql.collectives_table, a rank with two records of one instance (a duplicated seq)
is not collapsed as the oracle's per-rank dicts do.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from jobs import commbytes

from . import collectives as C
from . import step_sweep
from .instance_groups import Groups
from .storage.load import Traces

NS = 1e9
OPTIONAL = ("phase", "bucket", "unit", "microbatch")
FIRST = ("op", "axis", "group", "seq", "group_size", "payload_bytes", "backend_op") + OPTIONAL
# the oracle's row keys, in its order; the batches also carry SORT_KEYS and the integer ns
ROW_KEYS = ("step", "op", "axis", "group", "seq", "group_size", "ranks", "complete",
            "payload_bytes", "bytes_sent", "backend_op", "start_ns", "last_rank", "wait_s",
            "late_s", "others_wait_s", "duration_s", "span_s", "clock_error_s", "algbw_GBps",
            "busbw_GBps")
EXTRA = ("first_key", "wait_ns", "late_ns", "others_wait_ns", "n_ranks", "bw_key", "link_key")


class _Ctx:
    """What every pass shares: group-key ids per (rank, axis), clock errors per rank, the
    bus-bandwidth factor per (op, n), and the bandwidth and link groups' ids (instance_groups)."""

    def __init__(self, tr: Traces, hosts: dict | None = None):
        self.tr, self.ep = tr, C.ep_of(tr)
        self.ids: dict[tuple, int] = {}  # group_key -> id
        self.gk: dict[tuple, int] = {}  # (rank, axis) -> id of its group_key
        self.factors: dict[tuple, float | None] = {}
        self.groups = Groups(hosts)
        self.index = C._by_coords(tr)  # coordinates -> rank, for the peers
        self.peers: dict[tuple, int] = {}  # (rank, axis, peer) -> global peer (-1: none)

    def peer(self, rank: int, axis: str, q: int | None) -> int:
        """collectives.resolve_peer of a record (-1 for its None), once per triple."""
        if (rank, axis, q) not in self.peers:
            g = C.resolve_peer(self.tr, rank, {"peer": q, "axis": axis or None}, self.index)
            self.peers[(rank, axis, q)] = -1 if g is None else int(g)
        return self.peers[(rank, axis, q)]

    def key_id(self, rank: int, axis: str) -> int:
        if (rank, axis) not in self.gk:
            key = C.group_key(self.tr, rank, axis, self.ep)
            self.gk[(rank, axis)] = self.ids.setdefault(key, len(self.ids))
        return self.gk[(rank, axis)]

    def clock(self, nranks: int) -> np.ndarray:
        """clock_error_ns by rank (0 where the meta has none), as collectives_table reads it."""
        err = np.zeros(nranks, np.int64)
        for r, m in self.tr.meta.items():
            if 0 <= r < nranks:
                err[r] = int(m.get("clock_error_ns") or 0)
        return err

    def factor(self, op: str, n: int) -> float | None:
        if (op, n) not in self.factors:
            try:
                self.factors[(op, n)] = float(commbytes.busbw_factor(op, n))
            except ValueError:
                self.factors[(op, n)] = None
        return self.factors[(op, n)]


def _np(col, fill=0, dtype=None):
    if col.null_count:
        col = col.fill_null(fill)
    return np.asarray(col.to_numpy(zero_copy_only=False), dtype)


def _codes(col) -> tuple[np.ndarray, list]:
    d = pc.dictionary_encode(col)
    # a null (its own mask, handled by the caller) reads as code 0
    return (d.indices.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64),
            d.dictionary.to_pylist())


def _group_codes(tab: pa.Table) -> tuple[np.ndarray, np.ndarray, list]:
    """Per record: a code of match()'s group name (`group`, else the axis, else ''), a code
    of its axis ('' when absent) and the axes the latter index (both from the small
    dictionaries of the two columns: cheaper than encoding a coalesced string column)."""
    gc, gd = _codes(tab["group"].chunk(0))
    ac, ad = _codes(tab["axis"].chunk(0))
    gnull = tab["group"].is_null().to_numpy(zero_copy_only=False)
    anull = tab["axis"].is_null().to_numpy(zero_copy_only=False)
    axes = [*ad, ""] if "" not in ad else list(ad)
    ac = np.where(anull, axes.index(""), ac)
    names: dict[str, int] = {}
    glut = np.array([names.setdefault(x, len(names)) for x in gd] + [0], np.int64)
    alut = np.array([names.setdefault(x, len(names)) for x in axes], np.int64)
    gcode = np.where(gnull, alut[ac], glut[np.where(gnull, len(gd), gc)])
    return gcode, ac, axes


def _order(grp, sc, rank, row) -> np.ndarray:
    """The records' order by (instance, rank, row): one argsort of a packed key where the
    batch's value ranges fit in 63 bits (they do by far for step ranges of CHUNK_RECORDS),
    else a lexsort."""
    if not len(grp):
        return np.zeros(0, np.int64)
    row = row - row.min()
    bits = [int(x.max()).bit_length() for x in (grp, sc, rank, row)]
    if sum(bits) > 63:
        return np.lexsort((row, rank, sc, grp))
    key = grp
    for x, b in zip((sc, rank, row), bits[1:], strict=True):
        key = key << b | x
    return np.argsort(key)


def _p2p_keys(tab: pa.Table, rank, row, axcode, axes: list, ctx: _Ctx):
    """match()'s point-to-point keys: (whether each record is one, a dense code of its
    (sender, receiver, step), its counter: the records of its rank, pair and step before it
    in file order; -1 for the collectives)."""
    n = len(rank)
    p2p = step_sweep.codes(tab["op"], tuple(C.P2P)) if n else np.zeros(0, bool)
    code, cnt = np.full(n, -1, np.int64), np.full(n, -1, np.int64)
    idx = np.flatnonzero(p2p)
    if not len(idx):
        return p2p, code, cnt
    send = step_sweep.codes(tab["op"], ("send", "isend"))[idx]
    pv = _np(tab["peer"], 0, np.int64)[idx]
    pnull = tab["peer"].is_null().to_numpy(zero_copy_only=False)[idx]
    r, a = rank[idx], axcode[idx]
    uniq, inv = np.unique(np.column_stack((r, a, pv, pnull)), axis=0, return_inverse=True)
    glob = np.array([ctx.peer(int(x), axes[int(j)], None if z else int(q))
                     for x, j, q, z in uniq.tolist()], np.int64)[inv.reshape(-1)]
    snd, rcv = np.where(send, r, glob), np.where(send, glob, r)
    st = _np(tab["step"], -1, np.int64)[idx]
    o = np.lexsort((row[idx], st, rcv, snd, r))
    keys = np.column_stack((r, snd, rcv, st))[o]
    new = np.concatenate(([True], (keys[1:] != keys[:-1]).any(axis=1)))
    first = np.flatnonzero(new)
    pos = np.arange(len(o))
    c = np.empty(len(o), np.int64)
    c[o] = pos - first[np.cumsum(new) - 1]
    cnt[idx] = c
    code[idx] = np.unique(np.column_stack((snd, rcv, st)), axis=0,
                          return_inverse=True)[1].reshape(-1)
    return p2p, code, cnt


def _compute(tab: pa.Table, ctx: _Ctx, carry_step: int | None):
    """(instances table, records to carry into the next pass or None). carry_step: carry the
    incomplete instances whose records reach this step (-2: every incomplete one; None: no
    carry, the last pass)."""
    tab = tab.combine_chunks()
    rank = _np(tab["rank"], 0, np.int64)
    row = _np(tab["row"], 0, np.int64)
    assert tab["ts_ns"].null_count == 0 and row.max(initial=0) < 1 << 40
    gcode, axcode, axes = _group_codes(tab)
    assert rank.min(initial=0) >= 0
    present = np.flatnonzero(np.bincount(rank)) if len(rank) else rank
    lut = np.full((len(present) and present[-1] + 1, max(1, len(axes))), -1, np.int64)
    for r in present.tolist():  # group_key once per (rank, axis), not per record
        for j, a in enumerate(axes):
            lut[r, j] = ctx.key_id(r, a)
    gk = lut[rank, axcode]
    n_gk = max(1, len(ctx.ids))
    seq = tab["seq"]
    sv = _np(seq)
    sc = sv - (sv.min(initial=0) if len(sv) else 0) + 1
    sc[seq.is_null().to_numpy(zero_copy_only=False)] = 0  # None is its own key, as in match()
    grp = gcode * n_gk + gk
    # a point-to-point record's instance: its (pair, step) after every collective group, its
    # counter for seq (match()'s ("p2p", pair, step, counter))
    p2p, pcode, pcnt = _p2p_keys(tab, rank, row, axcode, axes, ctx)
    grp = np.where(p2p, grp.max(initial=0) + 1 + pcode, grp)
    sc = np.where(p2p, pcnt + 1, sc)
    assert sc.max(initial=0) < 1 << 40 and grp.max(initial=0) < 1 << 22
    inst = grp << 40 | sc
    k = rank << 40 | row  # unique per record; its order is match()'s append order
    order = _order(grp, sc, rank, row)
    inst = inst[order]
    n = len(inst)
    starts = np.flatnonzero(np.concatenate(([True], inst[1:] != inst[:-1]))) if n else \
        np.zeros(0, np.int64)
    parts = np.diff(np.append(starts, n))
    seg = np.repeat(np.arange(len(starts)), parts)
    ts = _np(tab["ts_ns"], 0, np.int64)[order]
    e = _np(tab["e"], 0, np.int64)[order]
    rk = rank[order]
    a_last = np.maximum.reduceat(ts, starts) if n else ts
    pos = np.arange(n)
    # the last arrival: latest ts, then highest rank (ranks ascend inside a segment)
    last = np.maximum.reduceat(np.where(ts == a_last[seg], pos, -1), starts) if n else pos
    ts2 = ts.copy()
    ts2[last] = np.iinfo(np.int64).min
    second = np.maximum.reduceat(ts2, starts) if n else ts
    start = np.minimum.reduceat(ts, starts) if n else ts
    step_all = _np(tab["step"], 0, np.int64)[order]
    red = (lambda f, x: f.reduceat(x, starts)) if n else (lambda f, x: x)
    first = tab.select(list(FIRST)).take(pa.array(order[starts]))
    pp = p2p[order[starts]] if n else p2p  # point-to-point instances: a send and its recv
    gs = _np(first["group_size"], 0, np.int64)
    size = np.where(gs != 0, gs, parts)  # int(group_size or len(parts))
    payload = _np(first["payload_bytes"], 0, np.int64)
    op = first["op"].fill_null("?")
    if pp.any():  # instance_row names them send_recv (the column keeps its type)
        op = pc.if_else(pa.array(pp), pa.scalar("send_recv"),
                        op.cast(pa.string())).cast(op.type)
        op = op if isinstance(op, pa.ChunkedArray) else pa.chunked_array([op])
    # instance_row: a transfer ends when its later side ends, a collective when its last
    # arrival does
    dur_ns = np.maximum(np.where(pp, red(np.maximum, e), e[last]) - a_last, 0)
    dur = dur_ns / NS
    has_bw = (dur > 0) & (payload != 0)
    alg = np.where(has_bw, payload / np.where(has_bw, dur, 1.0), np.nan)
    fac = np.full(len(starts), np.nan)
    opc, ops = _codes(op.chunk(0)) if len(starts) else (np.zeros(0, np.int64), [])
    for i, name in enumerate(ops):
        m = opc == i
        for nv in np.unique(size[m]):
            f = ctx.factor("send" if name == "send_recv" else name, int(nv))
            fac[m & (size == nv)] = np.nan if f is None else f
    late_ns = np.where(parts > 1, a_last - second, 0)
    others_ns = red(np.add, a_last[seg] - ts)
    wait_ns = a_last - start
    complete = parts >= np.where(pp, 2, size)
    axis = first["axis"].combine_chunks()
    axc, axes = _codes(axis) if len(starts) else (np.zeros(0, np.int64), [])
    axes = [str(x) for x in axes] + ["None"]  # as str(axis): a null is "None"
    axc = np.where(np.asarray(axis.is_null()), len(axes) - 1, axc)
    bw_key, link_key = ctx.groups.keys(opc, ops, axc, axes, payload, size, rk, starts,
                                       complete & ~np.isnan(alg * fac))
    cols = {
        "step": red(np.minimum, step_all), "op": op, "axis": first["axis"],
        "group": first["group"], "seq": first["seq"], "group_size": size,
        "ranks": pa.ListArray.from_arrays(pa.array(np.append(starts, n), pa.int32()),
                                          pa.array(rk)),
        "complete": complete, "payload_bytes": payload,
        "bytes_sent": red(np.maximum, _np(tab["bytes_sent"], 0.0)[order]),
        "backend_op": first["backend_op"], "start_ns": start, "last_rank": rk[last],
        "wait_s": wait_ns / NS, "late_s": late_ns / NS, "others_wait_s": others_ns / NS,
        "duration_s": dur, "span_s": (red(np.maximum, e) - start) / NS,
        "clock_error_s": red(np.maximum, ctx.clock(len(lut))[rk]) / NS,
        "algbw_GBps": pa.array(alg / 1e9, from_pandas=True),
        "busbw_GBps": pa.array(alg * fac / 1e9, from_pandas=True),
        **{c: first[c] for c in OPTIONAL},
        "first_key": k[order[starts]], "wait_ns": wait_ns, "late_ns": late_ns,
        "others_wait_ns": others_ns, "n_ranks": parts,
        "bw_key": pa.array(bw_key, pa.int32()), "link_key": pa.array(link_key, pa.int32())}
    out = pa.table(cols)
    if carry_step is None:
        return out, None
    keep = ~complete & ~pp  # a transfer is keyed by its step: never in two ranges
    if carry_step != -2:
        keep &= red(np.maximum, step_all) == carry_step
    if not keep.any():
        return out, None
    return out.filter(pa.array(~keep)), tab.take(pa.array(order[keep[seg]]))


# what comm_table reads of each rank's rows (step_ranges), strings as dictionaries
COLS = ("type", "ts_ns", "dur_ns", "op", "axis", "group", "seq", "group_size",
        "payload_bytes", "bytes_sent", "backend_op", "phase", "bucket", "unit", "microbatch",
        "peer")
DICT = ("type", "op", "axis", "group", "backend_op", "phase")
# comm_table's columns and types, carry's schema: strings stay dictionaries (as step_ranges
# decodes them: no string is built per record, and _group_codes reads the codes as they are)
_DSTR = pa.dictionary(pa.int32(), pa.string())
_TYPES = {"rank": pa.int32(), "row": pa.int64(), "ts_ns": pa.int64(), "e": pa.int64(),
          "step": pa.int64(), "op": _DSTR, "axis": _DSTR, "group": _DSTR,
          "seq": pa.int64(), "group_size": pa.int64(), "payload_bytes": pa.int64(),
          "bytes_sent": pa.float64(), "backend_op": _DSTR, "phase": _DSTR,
          "bucket": pa.int64(), "unit": pa.int64(), "microbatch": pa.int64(),
          "peer": pa.int64()}


def comm_table(tabs: dict) -> pa.Table:
    """One pass's comm records (_TYPES' columns; rank, then file row) from its rows per rank
    (step_ranges.passes or step_ranges.setup, COLS): ts_ns + dur_ns as `e`, a null step as -1, a
    null bytes_sent as 0. A column a file lacks reads as nulls."""
    parts = []
    for rank, t in sorted(tabs.items()):
        m = step_sweep.codes(t.column("type"), ("comm",))
        if not m.any():
            continue
        keep = [k for k in (*_TYPES, "dur_ns") if k in t.column_names]
        # the columns it needs only; a filter, chunk by chunk (a take over a table of many
        # chunks costs several times more)
        c = t.select(keep).filter(pa.array(m))
        cols = {k: _column(c, k, _TYPES[k]) for k in _TYPES if k not in ("e", "rank")}
        cols["rank"] = pa.array(np.full(c.num_rows, rank, np.int32))  # the file's rank
        cols["e"] = pc.add(cols["ts_ns"], pc.fill_null(_column(c, "dur_ns", pa.int64()), 0))
        cols["step"] = pc.fill_null(cols["step"], -1)
        cols["bytes_sent"] = pc.fill_null(cols["bytes_sent"], 0.0)
        parts.append(pa.table({k: cols[k] for k in _TYPES}))
    if not parts:
        return pa.schema(list(_TYPES.items())).empty_table()
    return pa.concat_tables(parts)


def _column(t: pa.Table, name: str, typ):
    """A column as `typ`; nulls where the file lacks it."""
    if name not in t.column_names:
        return pa.nulls(t.num_rows, typ)
    x = t.column(name)
    return x if x.type == typ else x.cast(typ)


class InstanceStream:
    """instance_batches' state between passes: the group keys and the records carried into
    the next pass, so that the passes can be fed by more than one reader (the live analysis
    feeds the first ones while the run goes, analyze_live.py; the post-run read the rest)."""

    def __init__(self, tr: Traces, hosts: dict | None = None):
        self.ctx = _Ctx(tr, hosts)
        self.carry = None

    def feed(self, carry_step: int, tab: pa.Table, last: bool = False) -> pa.Table | None:
        """One pass's comm_table (carry_step: its last step, -2 for the setup records');
        its instances, or None. `last`: the run's last pass (nothing carried on)."""
        if self.carry is not None:
            tab = pa.concat_tables([self.carry, tab.cast(self.carry.schema)])
        if not tab.num_rows:
            self.carry = None
            return None
        out, self.carry = _compute(tab, self.ctx, None if last else carry_step)
        return out if out.num_rows else None

    def flush(self) -> pa.Table | None:
        """The carried records' instances, when no last pass came (nothing after them)."""
        if self.carry is None:
            return None
        return self.feed(-2, self.carry.schema.empty_table(), last=True)


def instance_batches(tr: Traces, out_dir, passes=None,
                     stream: InstanceStream | None = None) -> Iterator[pa.Table]:
    """One table per pass, one row per collective instance: collectives_table's keys (the
    optional phase / bucket / unit / microbatch as nullable columns) plus EXTRA (first_key:
    the oracle's tie-break, rank << 40 | file row of the first record; the integer ns behind
    wait_s / late_s / others_wait_s; n_ranks = len(ranks), which readers filter on without
    decoding the lists). `passes`: (carry step, comm_table) per pass, the setup records'
    first (carry step -2), then each step range's (its last step); default read here from
    out_dir's rank files (step_ranges; the engine shares its read with the step sweep and
    the axis sums). `stream`: the state of the passes fed before these. A field kept in
    a record's args (engine.hidden_fields) is read as missing."""
    if passes is None:
        from .storage import step_ranges
        files = step_ranges.open_files(out_dir, COLS, DICT)
        passes = ((-2 if hi is None else hi, comm_table(tabs))
                  for _lo, hi, tabs in step_ranges.scan(files, step_sweep.CHUNK_RECORDS))
    stream = stream if stream is not None else InstanceStream(tr)
    for (carry_step, tab), last in _last_marked(passes):
        out = stream.feed(carry_step, tab, last)
        if out is not None:
            yield out


def _last_marked(items):
    """(item, whether it is the last one) for each item of an iterator."""
    it = iter(items)
    try:
        prev = next(it)
    except StopIteration:
        return
    for x in it:
        yield prev, False
        prev = x
    yield prev, True


def sort_indices(table: pa.Table):
    """The oracle's row order: (start_ns, str(group), seq or 0), then match()'s order."""
    group = table["group"]
    if pa.types.is_dictionary(group.type):  # Arrow sorts no dictionary column
        group = group.cast(pa.string())
    t = pa.table({"a": table["start_ns"], "b": pc.fill_null(group, "None"),
                  "c": pc.fill_null(table["seq"], 0), "d": table["first_key"]})
    return pc.sort_indices(t, [(c, "ascending") for c in "abcd"])


def rows_of(tables: list[pa.Table], tr: Traces) -> list[dict]:
    """collectives_table's rows from instance batches (and its incomplete-instances
    warning on tr.warnings)."""
    tables = [t for t in tables if t.num_rows]
    if not tables:
        return []
    tab = pa.concat_tables(tables)
    tab = tab.take(sort_indices(tab))
    rows = []
    for x in tab.select(list(ROW_KEYS + OPTIONAL)).to_pylist():
        for k in OPTIONAL:
            if x[k] is None:
                del x[k]
        rows.append(x)
    warn_incomplete(tr, sum(not r["complete"] for r in rows))
    return rows


def warn_incomplete(tr: Traces, incomplete: int) -> None:
    """collectives_table's warning on instances seen on fewer ranks than their group."""
    if incomplete:
        tr.warnings.append(f"{incomplete} communication instance(s) seen on fewer ranks than "
                           "their group size (missing ranks, or a cancelled run)")
