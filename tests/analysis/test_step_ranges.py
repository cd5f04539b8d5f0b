"""The scale path's one read of the rank files (jobs/analysis/storage/step_ranges.py): each row
group decoded for the step ranges its own steps meet, not for those its footer's statistics do."""

from __future__ import annotations

from collections import Counter

import pyarrow.parquet as pq

from jobs.analysis import instances as NC
from jobs.analysis import step_sweep as NS
from jobs.analysis.storage import convert, step_ranges
from tests.analysis.test_columnar import dp_tp_run


def _run(tmp_path, rows_per_group=9):
    run = dp_tp_run(tmp_path / "run", steps=8)
    convert.convert_run_dir(run)
    for p in run.glob("trace-rank*.parquet"):  # many groups, as a real-size file has
        pq.write_table(pq.read_table(p), p, row_group_size=rows_per_group)
    return run


def _counted(monkeypatch) -> Counter:
    seen: Counter = Counter()
    orig = step_ranges.RankFile._group

    def group(self, i):
        if self._cache is None or self._cache[0] != i:
            seen[(self.rank, i)] += 1
        return orig(self, i)
    monkeypatch.setattr(step_ranges.RankFile, "_group", group)
    return seen


def test_the_end_records_group_is_not_decoded_for_every_range(tmp_path, monkeypatch):
    """The last group holds the `end` record (step -1) after the last steps: its footer says
    [-1, last step], which meets every range. Decoded once by `setup`, its own bounds stand,
    and the ranges before its steps leave it alone."""
    run = _run(tmp_path)
    seen = _counted(monkeypatch)
    files = step_ranges.open_files(run, NC.COLS, NC.DICT)
    last = {f.rank: len(f.groups) - 1 for f in files}
    footer = {f.rank: f.groups[-1] for f in files}
    assert all(g[1] == -1 and g[3] for g in footer.values())  # what the footer says
    rows = Counter()
    passes = 0
    for lo, _hi, tabs in step_ranges.scan(files, 40):
        passes += lo is not None
        for rank, t in tabs.items():
            rows[rank] += t.num_rows
    assert passes >= 4
    assert {f.rank: f.rows for f in files} == dict(rows)  # every row once
    for f in files:
        _, lo, hi, setup = f.groups[-1]
        steps = pq.read_table(run / f"trace-rank{f.rank}.parquet").column("step")
        tail = steps.to_pylist()[f.groups[-1][0]:]  # the last group's rows
        assert (lo, hi, setup) == (min(s for s in tail if s >= 0),
                                   max(s for s in tail if s >= 0), True)
        # setup, then the ranges its steps meet (one, two where a boundary falls in it)
        assert seen[(f.rank, last[f.rank])] <= 3, seen


def test_refined_bounds_give_the_same_rows_as_the_footers(tmp_path, monkeypatch):
    """Each range's rows are the same with the groups' bounds left as the footers say (the
    refinement undone): refining only skips groups holding none of a range's rows."""
    run = _run(tmp_path, rows_per_group=7)

    def read(refine: bool):
        if not refine:
            monkeypatch.setattr(step_ranges.RankFile, "_refine", lambda self, i, s, null: None)
        files = step_ranges.open_files(run, NS.COLS, NS.DICT)
        out = [(lo, hi, {r: t.to_pydict() for r, t in sorted(tabs.items())})
               for lo, hi, tabs in step_ranges.scan(files, 30)]
        monkeypatch.undo()
        return out
    want, got = read(False), read(True)
    assert len(want) > 3 and got == want


def test_ranges_from_a_start_step_cover_the_rest_as_the_whole_run_does(tmp_path):
    """step_ranges.ranges(start=): the steps from `start` on (what the post-run read does after
    the live analysis), in ranges of about the budget's rows, as the whole run's would be."""
    run = _run(tmp_path)
    files = step_ranges.open_files(run, NC.COLS, NC.DICT)
    whole = step_ranges.ranges(files, 40)
    assert whole[0][0] == 0 and whole[-1][1] == 7 and len(whole) >= 4
    for start in (0, 3, 7):
        got = step_ranges.ranges(files, 40, start)
        assert got[0][0] == start and got[-1][1] == 7
        assert all(b + 1 == c for (_, b), (c, _) in zip(got, got[1:], strict=False))
        # ranges for the rest's share of the rows: no wider than the whole run's
        assert max(b - a for a, b in got) <= max(b - a for a, b in whole)
        assert (start == 0) == (got == whole)
    assert step_ranges.ranges(files, 40, 8) == []  # nothing left
    rows = sum(t.num_rows for _, _, tabs in step_ranges.passes(files, 40, 3)
               for t in tabs.values())
    steps = [s for p in run.glob("trace-rank*.parquet")
             for s in pq.read_table(p, columns=["step"])["step"].to_pylist()]
    assert rows == sum(1 for s in steps if s is not None and s >= 3) > 0  # every row once
