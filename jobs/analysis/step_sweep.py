"""The step_rank table's sweep: windows and events formed in numpy from each rank's rows of
one step range (step_ranges.py: the read the collectives share).

oracle.steps.step_row's interval algebra as one sweep per (rank, step): every interval becomes a +1
at its start and a -1 at its end on one of three counters, A compute spans, B blocking comm
records (steps.is_blocking's rule), C all comm records; between two consecutive event times the
state is constant, so with the segment clipped to the step window [t0, t1]

    compute = A > 0 and B = 0      comm = C > 0
    overlap = compute and comm     exposed = comm and not compute     busy = compute or comm

and each figure is a sum of segment lengths: the same integers as steps.py's unions and
differences (tests/analysis/test_columnar.py, test_engine.py compare the rows). Per rank and
step range of its file:

    window   per (rank, step): the first `step` span by (start, file row) gives t0, t1, loss
             and loss_weight; else the extent of the step's span and comm records
    blocking a comm record blocks (counter B) when `async` says so, never when it is a bucket
             or a wait / issue record, else when a compute span of its step started at or
             before it and the latest end of those spans reaches its end (the ASOF join)
    events   +1 / -1 at the start / end of every non-empty compute span (A), blocking comm
             record (B) and comm record (C)

and sums the segments between consecutive events (`sweep`). Reading only `type, step, ts_ns,
dur_ns, cat, async, bucket, end, loss, loss_weight` (strings as dictionaries) and grouping
with one argsort per range replaced a DuckDB query's materialised CTEs and ASOF join
(docs/benchmarks.md).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from . import steps as S

CHUNK_RECORDS = 1_000_000  # rows per step range over all rank files (step_ranges.ranges)
SUMS = ("compute_ns", "comm_ns", "overlap_ns", "exposed_ns", "busy_ns")
COLS = ("type", "step", "ts_ns", "dur_ns", "cat", "async", "bucket", "end", "loss",
        "loss_weight")
DICT = ("type", "cat", "end")
# the fields the sweep reads of span and comm records: a record that keeps one of them in
# `args` instead of its column is read without it, and the analysis says so
# (engine.hidden_fields)
FIELDS = COLS[1:]


def codes(col, values) -> np.ndarray:
    """Whether each row of a dictionary column is one of `values` (null: False)."""
    col = col.combine_chunks() if hasattr(col, "combine_chunks") else col
    if not hasattr(col, "dictionary"):  # a plain string column (an empty read)
        return np.isin(np.asarray(col.to_pylist(), object), list(values))
    hit = np.isin(np.asarray(col.dictionary.to_pylist(), object), list(values))
    if not hit.any():
        return np.zeros(len(col), bool)
    idx = col.indices
    nulls = idx.null_count
    idx = (idx.fill_null(0) if nulls else idx).to_numpy(zero_copy_only=False)
    (one,) = np.flatnonzero(hit) if hit.sum() == 1 else (None,)
    out = idx == one if one is not None else hit[idx]  # one value: a compare, not a gather
    return out & np.asarray(col.is_valid()) if nulls else out


def _num(col, fill, dtype) -> np.ndarray:
    return np.asarray(col.fill_null(fill).to_numpy(zero_copy_only=False), dtype)


PACK_LIMIT = 1 << 62  # packed (group, time) keys stay below it (int64, with room for a sum)


class _Pack:
    """(group, time) as one int64 key, g * W + (t - base[g]), where every time of group g lies
    in [base[g], base[g] + W): W is the widest group's time extent (a step's, not the range's),
    so a range of many long steps still packs. Where it would not (`ok` False) the callers
    take their slower exact paths."""

    def __init__(self, base: np.ndarray, top: np.ndarray):
        self.base = base
        self.w = int((top - base).max(initial=0)) + 1
        self.ok = len(base) * self.w < PACK_LIMIT

    def key(self, g, t):
        return g * self.w + (t - self.base[g])


def _sort_gs(g, s, pack: _Pack):
    """The order of rows by (g, s), ties in row order."""
    if not len(g):
        return np.zeros(0, np.int64)
    if pack.ok:
        return np.argsort(pack.key(g, s), kind="stable")
    return np.lexsort((s, g))


def _running_max(g, e, pack: _Pack):
    """Per row of rows sorted by group: the latest `e` of its group's rows so far."""
    if pack.ok:
        k = pack.key(g, e)
        return np.maximum.accumulate(k) - k + e
    out = np.empty_like(e)  # one accumulate per group
    cut = np.flatnonzero(np.diff(g)) + 1
    for a, b in zip(np.r_[0, cut], np.r_[cut, len(g)], strict=True):
        out[a:b] = np.maximum.accumulate(e[a:b])
    return out


def _last_at_or_before(g_sorted, s_sorted, g, s, pack: _Pack):
    """Per (g, s): the index of the last row of the (g, s)-sorted rows of group g that starts
    at or before s (-1: none; a row of another group is never returned)."""
    if pack.ok:
        pos = np.searchsorted(pack.key(g_sorted, s_sorted), pack.key(g, s), side="right") - 1
    else:
        pos = np.empty(len(g), np.int64)
        for x in np.unique(g):
            a, b = np.searchsorted(g_sorted, [x, x + 1])
            m = g == x
            pos[m] = a + np.searchsorted(s_sorted[a:b], s[m], side="right") - 1
    ok = pos >= 0
    ok[ok] = g_sorted[pos[ok]] == g[ok]
    return np.where(ok, pos, -1)


def chunk(t, rank: int, lo: int) -> tuple[dict, dict]:
    """(events, windows) of one rank's rows in one step range (`sweep`'s input)."""
    typ = t.column("type")
    span, comm = codes(typ, ("span",)), codes(typ, ("comm",))
    keep = np.flatnonzero(span | comm)
    span, comm = span[keep], comm[keep]
    step = t.column("step").to_numpy(zero_copy_only=False).astype(np.int64)[keep]
    s = _num(t.column("ts_ns"), 0, np.int64)[keep]
    e = s + _num(t.column("dur_ns"), 0, np.int64)[keep]
    g = step - lo
    width = int(g.max()) + 1 if len(g) else 0
    present = np.bincount(g, minlength=width) > 0
    gi = np.cumsum(present) - 1  # group -> window row
    nwin = int(present.sum())
    xs = np.full(width, np.iinfo(np.int64).max)
    xe = np.full(width, np.iinfo(np.int64).min)
    np.minimum.at(xs, g, s)
    np.maximum.at(xe, g, e)
    ops = np.bincount(g[comm], minlength=width)

    # every start and end of group g lies in [xs[g], xe[g]] (absent groups: never keyed)
    pack = _Pack(np.where(present, xs, 0), np.where(present, xe, 0))
    # the first step span of each group by (start, file row)
    stepspan = span & codes(t.column("cat"), ("step",))[keep]
    si = np.flatnonzero(stepspan)
    si = si[_sort_gs(g[si], s[si], pack)]
    gs, first = np.unique(g[si], return_index=True)
    first = si[first]
    t0, t1 = xs.copy(), xe.copy()
    t0[gs], t1[gs] = s[first], e[first]
    has = np.zeros(width, bool)
    has[gs] = True
    win = {"rank": np.full(nwin, rank, np.int64), "step": np.flatnonzero(present) + lo,
           "t0": t0[present], "t1": t1[present], "has_step": has[present],
           "comm_ops": ops[present]}
    for k in ("loss", "loss_weight"):
        col = t.column(k)
        v = _num(col, 0.0, np.float64)[keep]
        m = np.asarray(col.is_null())[keep]
        val, mask = np.zeros(width), np.ones(width, bool)
        val[gs], mask[gs] = v[first], m[first]
        win[k] = np.ma.masked_array(val[present], mask[present])

    # blocking: the ASOF join as a search in the compute spans sorted by (group, start)
    comp = np.flatnonzero(span & codes(t.column("cat"), S.COMPUTE_CATS)[keep])
    comp = comp[_sort_gs(g[comp], s[comp], pack)]
    ci = np.flatnonzero(comm)
    blocking = np.zeros(len(ci), bool)
    if len(comp) and len(ci):
        run = _running_max(g[comp], e[comp], pack)
        pos = _last_at_or_before(g[comp], s[comp], g[ci], s[ci], pack)
        ok = pos >= 0
        blocking[ok] = run[pos[ok]] >= e[ci][ok]
    asy = t.column("async")
    asy_valid = np.asarray(asy.is_valid())[keep][ci]
    asy_v = _num(asy, False, bool)[keep][ci]
    quiet = (np.asarray(t.column("bucket").is_valid())[keep][ci]
             | codes(t.column("end"), ("wait", "issue"))[keep][ci])
    blocking = np.where(asy_valid, ~asy_v, ~quiet & blocking)

    ce = comp[e[comp] > s[comp]]
    be = ci[blocking & (e[ci] > s[ci])]
    cc = ci[e[ci] > s[ci]]
    idx = np.concatenate([ce, ce, be, be, cc, cc])
    n = [len(ce), len(ce), len(be), len(be), len(cc), len(cc)]
    ev = {"w": gi[g[idx]], "t": np.concatenate([s[ce], e[ce], s[be], e[be], s[cc], e[cc]]),
          "pack": _Pack(xs[present], xe[present])}  # by window row
    for i, k in enumerate("abc"):  # +1 at starts, -1 at ends, on counter k only
        ev[k] = np.repeat(np.array([1 if j // 2 == i else 0 for j in range(6)], np.int8)
                          * np.array([1, -1] * 3, np.int8), n)
    return ev, win


_K = 21  # bits per counter in sweep's packed running sums


def sweep(ev: dict, win: dict) -> list:
    """(compute, comm, overlap, exposed, busy) ns per window row. `ev`: the events' window
    row `w`, time `t` and counter deltas a, b, c, each interval's start listed before its end
    (chunk's order); `win`: t0, t1 per row. Event times are clipped to their window first
    (monotone, so the order stays valid and a segment's clipped length is the difference of
    its ends); the counters are running sums over the events sorted by (w, t), each window's
    deltas summing to 0 so that one cumsum serves all, the three packed in one int64 (_K bits
    each: counters never go negative, ties sorting stably start-first). A segment runs from
    an event to the next one of its window. The order among events of equal time does not
    matter: the segments between them are empty, the counters after the last the same sums.
    exposed = comm - overlap and busy = compute + comm - overlap (integer ns: exact)."""
    nwin = len(win["t0"])
    out = np.zeros((5, nwin), np.int64)
    if not len(ev["t"]):
        return list(out)
    w = ev["w"]
    t = np.clip(ev["t"], win["t0"][w], win["t1"][w])
    order = _sort_gs(w, t, ev["pack"])
    w, t = w[order], t[order]
    if len(t) < 1 << _K:  # no counter reaches 2^_K
        d = ((ev["a"].astype(np.int64) << 2 * _K) + (ev["b"].astype(np.int64) << _K)
             + ev["c"])
        run = np.cumsum(d[order])
        a, b, c = run >> 2 * _K, (run >> _K) & ((1 << _K) - 1), run & ((1 << _K) - 1)
    else:
        a, b, c = (np.cumsum(ev[k][order], dtype=np.int64) for k in "abc")
    same = w[1:] == w[:-1]
    seg = np.append(np.where(same, np.diff(t), 0), 0)  # the last event opens no segment
    comp_on = np.append((a[:-1] > 0) & (b[:-1] == 0), False)
    comm_on = np.append(c[:-1] > 0, False)
    starts = np.flatnonzero(np.concatenate(([True], ~same)))
    at = w[starts]
    for i, m in enumerate((comp_on, comm_on, comp_on & comm_on)):
        out[i, at] = np.add.reduceat(np.where(m, seg, 0), starts)
    out[3] = out[1] - out[2]
    out[4] = out[0] + out[1] - out[2]
    return list(out)


def rows_of(tabs: dict, lo: int):
    """The step_rank integers of one step range's rows per rank (step_ranges.passes' dict, the
    range starting at step `lo`): per rank, columns (rank, step, t0, t1, has_step, comm_ops,
    loss, loss_weight, compute_ns, comm_ns, overlap_ns, exposed_ns, busy_ns) as numpy arrays
    in step order. A rank whose file lacks one of COLS gives none."""
    for rank, t in sorted(tabs.items()):
        if not set(COLS) <= set(t.column_names):
            continue
        ev, win = chunk(t, rank, lo)
        if len(win["step"]):
            yield {**win, **dict(zip(SUMS, sweep(ev, win), strict=True))}


def build(out_dir: Path, budget: int | None = None):
    """rows_of over each step range of about `budget` rows (CHUNK_RECORDS: a range's arrays
    stay in the tens of MB) of the run's rank files, read by step_ranges (`COLS`)."""
    from .storage import step_ranges
    files = step_ranges.open_files(out_dir, COLS, DICT)
    for lo, _hi, tabs in step_ranges.passes(files, budget or CHUNK_RECORDS):
        yield from rows_of(tabs, lo)
