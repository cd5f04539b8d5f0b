"""One read of each rank file per step range: the rows the step sweep (step_sweep),
the collectives (instances) and the axis sums (axis_sums) take from a run's Parquet files,
decoded once for all three (one_read.py).

Each file's row groups carry step statistics. A step range [lo, hi] reads the row groups
whose [min, max] meets it, keeps the range's rows (a numpy mask on `step`) and numbers them
by file row (`row`: the DuckDB view's file_row_number, the order the oracle's matching
follows). The last row group read stays decoded for the next range when it holds at most
CACHE_ROWS rows: consecutive ranges share at most the group their boundary falls in, so each
group is decoded once (columnar.ROW_GROUP_ROWS is below it; a larger group of an older file
is decoded again by each range it meets, as DuckDB's scan did).

Ranges (`ranges`): about `budget` rows over all files, steps [lo, hi] of equal width, from
the footers' row counts and statistics alone (no scan). Rows of a null or negative step are
in no range: `setup` reads them.

A decoded group's own steps replace its footer bounds: the file's last group holds the `end`
record (step -1) after the last steps, so its statistics say [-1, last step] and every range
met it, decoding it again each time (measured on a converted 5 M-record run: 152 group
decodes for 80 groups; 88 now). Once read (by `setup`, first), its bounds are those of its
non-negative steps, and whether it holds setup rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from . import columnar

# a row group kept decoded for the next range holds at most this many rows: one per rank
# file in memory (the converter's groups, columnar.ROW_GROUP_ROWS, are this size)
CACHE_ROWS = 1 << 16
_INF = float("inf")


def read_columns(names, columns) -> list[str]:
    """The columns of a rank file (its column `names`) a read gives: `step` first, then
    `columns` it has, but not `rank`, which the converter writes in every row (RankFile.rank,
    once). The live analysis forms its rows the same way (analyze_live.py)."""
    return [c for c in dict.fromkeys(("step", *columns)) if c in names and c != "rank"]


class RankFile:
    """One rank's Parquet file: its row groups' first rows and step bounds, and `read`."""

    def __init__(self, path: Path, columns, dictionary=()):
        import pyarrow.parquet as pq
        schema = pq.read_schema(path)
        names = set(schema.names)
        self.pf = pq.ParquetFile(path, read_dictionary=[c for c in dictionary if c in names])
        self.names = names
        self.columns = read_columns(names, columns)
        md = self.pf.metadata
        self.rows = md.num_rows
        # per row group: (first row, min step, max step, whether it may hold a null or
        # negative step), from the footer until the group is decoded (_refine)
        self.groups: list[tuple[int, float, float, bool]] = []
        j = schema.get_field_index("step")
        at = 0
        for i in range(md.num_row_groups):
            g = md.row_group(i)
            st = g.column(j).statistics if j >= 0 else None
            nulls = st is None or not st.has_null_count or st.null_count > 0
            if st is not None and st.has_min_max:
                lo, hi = st.min, st.max
            elif st is not None and st.has_null_count and st.null_count == g.num_rows:
                lo, hi = _INF, -_INF  # every step null: in no range
            else:
                lo, hi = -_INF, _INF  # no statistics: read for every range
            self.groups.append((at, lo, hi, nulls or lo < 0))
            at += g.num_rows
        self._cache: tuple[int, object] | None = None
        self.rank = self._rank()

    def _rank(self) -> int | None:
        if not self.rows or "rank" not in self.names:
            return None
        col = self.pf.read_row_group(0, columns=["rank"]).column(0)
        return int(col[0].as_py()) if len(col) else None

    def _group(self, i: int):
        if self._cache is not None and self._cache[0] == i:
            return self._cache[1]
        t = self.pf.read_row_group(i, columns=self.columns)
        self._cache = (i, t) if t.num_rows <= CACHE_ROWS else None
        return t

    def bounds(self) -> tuple[float, float]:
        """(min, max) step over the row groups' statistics (inf, -inf: none)."""
        return (min((g[1] for g in self.groups), default=_INF),
                max((g[2] for g in self.groups), default=-_INF))

    def read(self, lo: int, hi: int):
        """The rows of steps lo..hi (Arrow, `columns` + `row`), or None."""
        return self._rows(lambda glo, ghi, setup: not (ghi < lo or glo > hi),
                          lambda s, null: ~null & (s >= lo) & (s <= hi))

    def setup(self):
        """The rows of a null or negative step (the setup records, `end`), or None."""
        return self._rows(lambda glo, ghi, setup: setup,
                          lambda s, null: null | (s < 0))

    def _refine(self, i: int, s, null) -> None:
        """Group i's bounds from its decoded steps `s` (`null`: their null mask): those of its
        steps >= 0 (inf, -inf: none), and whether it holds a null or negative one."""
        setup = null | (s < 0)
        ok = s[~setup]
        lo, hi = (int(ok.min()), int(ok.max())) if len(ok) else (_INF, -_INF)
        first, glo, ghi, _ = self.groups[i]
        assert not len(ok) or glo <= lo <= hi <= ghi, (i, glo, ghi, lo, hi)  # the footer's
        self.groups[i] = (first, lo, hi, bool(setup.any()))

    def _rows(self, meets, keep):
        """The rows `keep(steps, null mask)` selects of the row groups `meets(min step, max
        step, may hold setup rows)` admits, numbered by file row."""
        import pyarrow as pa
        parts = []
        for i, (first, glo, ghi, setup) in enumerate(self.groups):
            if not meets(glo, ghi, setup):
                continue
            t = self._group(i)
            step = t.column("step")
            null = np.asarray(step.is_null()) if step.null_count else \
                np.zeros(len(step), bool)
            s = np.asarray(step.fill_null(0).to_numpy(zero_copy_only=False) if step.null_count
                           else step.to_numpy(zero_copy_only=False), np.int64)
            self._refine(i, s, null)
            idx = np.flatnonzero(keep(s, null))
            if not len(idx):
                continue
            if len(idx) == t.num_rows:
                part = t
            elif idx[-1] - idx[0] + 1 == len(idx):  # one run of rows (a sorted file): a view
                part = t.slice(int(idx[0]), len(idx))
            else:
                part = t.take(pa.array(idx))
            parts.append(part.append_column("row", pa.array(first + idx, pa.int64())))
        return pa.concat_tables(parts) if parts else None


def open_files(out_dir: Path, columns, dictionary=()) -> list[RankFile]:
    """The run's rank files (name order) that hold rows and a rank."""
    files = [RankFile(p, columns, dictionary)
             for p in sorted(Path(out_dir).glob("trace-rank*" + columnar.SUFFIX))]
    return [f for f in files if f.rank is not None]


def ranges(files: list[RankFile], budget: int, start: int = 0) -> list[tuple[int, int]]:
    """Step ranges of about `budget` rows over all files (footers only; a file without step
    statistics costs one read of its steps), from step `start` on (the steps before it
    analysed already: the live analysis, analyze_live.py)."""
    b = [f.bounds() for f in files]
    if any(x == -_INF or y == _INF for x, y in b):
        lo, hi = _scan_bounds(files)
    else:
        lo, hi = min((x for x, _ in b), default=None), max((y for _, y in b), default=None)
    if hi is None or hi < max(0, start):
        return []
    first, hi = max(0, int(lo)), int(hi)
    lo = max(start, first)
    # the rows of steps lo..hi, taken as the steps' share of all rows
    rows = sum(f.rows for f in files) * (hi - lo + 1) // (hi - first + 1)
    k = max(1, -(-rows // max(1, budget)))
    width = -(-(hi - lo + 1) // k)
    return [(a, min(hi, a + width - 1)) for a in range(lo, hi + 1, width)]


def _scan_bounds(files: list[RankFile]) -> tuple[int | None, int | None]:
    lo = hi = None
    for f in files:
        steps = f.pf.read(columns=["step"]).column(0).drop_null().to_numpy()
        steps = steps[steps >= 0]
        if len(steps):
            lo = int(steps.min()) if lo is None else min(lo, int(steps.min()))
            hi = int(steps.max()) if hi is None else max(hi, int(steps.max()))
    return lo, hi


def setup(files: list[RankFile]) -> dict:
    """{rank: its rows of a null or negative step} (ranks without any left out)."""
    out = {}
    for f in files:
        t = f.setup()
        if t is not None:
            out[f.rank] = t
    return out


def scan(files: list[RankFile], budget: int) -> Iterator[tuple[int | None, int | None, dict]]:
    """Every row once: (None, None, setup(files)) first, then `passes`."""
    yield None, None, setup(files)
    yield from passes(files, budget)


def passes(files: list[RankFile], budget: int,
           start: int = 0) -> Iterator[tuple[int, int, dict]]:
    """Per step range from step `start` on: (lo, hi, {rank: its rows of the range}); ranks
    without rows left out."""
    for lo, hi in ranges(files, budget, start):
        tabs = {}
        for f in files:
            t = f.read(lo, hi)
            if t is not None:
                tabs[f.rank] = t
        yield lo, hi, tabs
