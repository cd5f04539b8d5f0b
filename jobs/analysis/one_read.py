"""The engine's one read: each rank file decoded once per step range
(step_ranges), its rows feeding the three consumers of record-scale data in one pass:

    the step sweep     step_sweep.rows_of   -> step_tables.write_step_rank (table-step_rank)
    the collectives    instances.comm_table -> bandwidth_links.InstanceWriter (table-collectives)
    the axis sums      axis_sums.Sums       -> axis_bytes and links

with the setup records (a null or negative step) read once for the collectives' first pass
and the setup bytes. Reading the files three times (two per-rank reads and a DuckDB scan)
cost a fifth of the whole analysis at 50 M records (docs/benchmarks.md).

The consumers' state lives in a `OneRead`, fed pass by pass: by the post-run read of the
Parquet files (`read`), or first by the live analysis with the row groups the live
conversion writes while the run goes (analyze_live.py) and then by the post-run read from
the first step it did not reach (`read(out_dir, start=next_step)`). Either way each pass is
fed once, in step order, so the tables are the same.
"""

from __future__ import annotations

from pathlib import Path

from . import assemble as A
from .storage.load import Traces
from .straggler_sums import Lateness


def columns() -> tuple[tuple, tuple]:
    """(step_ranges's columns, those read as dictionaries): what the three consumers read."""
    from . import axis_sums as NA
    from . import instances as NC
    from . import step_sweep as NS
    return NS.COLS + NC.COLS + NA.COLS, NS.DICT + NC.DICT + NA.DICT


class OneRead:
    """The three consumers of one read. A consumer that raises stops and its table is left
    out with the reason (`finish`); the others go on."""

    def __init__(self, tr: Traces, path: dict, sampler=None, hosts: dict | None = None):
        from . import axis_sums as NA
        from . import bandwidth_links as SC
        from . import instances as NC
        self.path, self.sampler = path, sampler
        self.parts: list = []  # step_sweep.rows_of's chunks
        self.sums = NA.Sums()
        # tr: the ranks' meta, for the group keys; hosts: links.rank_hosts', for the links
        self.stream = NC.InstanceStream(tr, hosts)
        self.out = SC.InstanceWriter(path["collectives"],
                                     sampler.add if sampler is not None else None)
        self.failed: dict[str, Exception] = {}  # consumer -> what it raised
        self.next_step = 0  # the first step no pass has read
        self.ended = False  # the run's last pass was fed (no records carried on)

    def _guard(self, name: str, fn) -> None:
        if name not in self.failed:
            try:
                fn()
            except Exception as exc:  # noqa: BLE001 - said as that table's, by A.safe (finish)
                self.failed[name] = exc

    def feed(self, lo: int | None, hi: int | None, tabs: dict, last: bool = False) -> None:
        """One pass: the setup records (lo, hi None) or steps lo..hi, {rank: its rows} as
        step_ranges gives them (columns(), `row` the file row). `last`: no pass follows."""
        from . import step_sweep as NS
        if lo is not None:
            self._guard("step_rank", lambda: self.parts.extend(NS.rows_of(tabs, lo)))
        for rank, t in sorted(tabs.items()):
            self._guard("axis", lambda rank=rank, t=t: self.sums.add(rank, t, lo is not None))
        self._guard("collectives", lambda: self._instances(-2 if hi is None else hi, tabs,
                                                           last))
        if hi is not None:
            self.next_step = hi + 1
        self.ended = last

    def _instances(self, carry_step: int, tabs: dict, last: bool) -> None:
        from . import instances as NC
        b = self.stream.feed(carry_step, NC.comm_table(tabs), last)
        if b is not None:
            self.out.write(b)

    def read(self, out_dir: Path, start: int | None = None) -> None:
        """Every pass of the run's Parquet files (the setup records', then each step
        range's), or with `start` the step ranges from that step on only (the passes
        before it were fed already)."""
        from . import step_sweep as NS
        from .instances import _last_marked
        from .storage import step_ranges
        cols, dicts = columns()
        files = step_ranges.open_files(out_dir, cols, dicts)
        items = step_ranges.scan(files, NS.CHUNK_RECORDS) if start is None else \
            step_ranges.passes(files, NS.CHUNK_RECORDS, start)
        for (lo, hi, tabs), last in _last_marked(items):
            self.feed(lo, hi, tabs, last)

    def discard(self) -> None:
        """Closes and removes the instances' file (a reader not finished)."""
        self.out.close()
        Path(self.path["collectives"]).unlink(missing_ok=True)

    def finish(self, tr: Traces, pipe=None):
        """(step_rank table or None, collective instances, axis, lateness) with the two tables
        written to path["step_rank"] and path["collectives"]; `axis`: a callable giving
        axis_sums.axis_sums' result or raising what computing it raised; `lateness`: the
        instances' straggler_sums.Lateness (empty where they failed). Warnings on tr.warnings in the
        oracle's order (step_rank's, then the collectives'). Failed instances leave no
        file (no table may read a part of them). `pipe`: write_step_rank's (a pipeline's
        bubble)."""
        from . import step_tables as SS
        if not self.ended:  # records carried past the last pass fed
            self._guard("collectives", lambda: self._flush())
        w = tr.warnings
        at = len(w)
        n_coll = A.safe(w, "collectives", lambda: _unless(
            self.failed.get("collectives"), lambda: self.out.close(tr, self.stream.ctx)),
            None)
        if n_coll is None:
            self.discard()
        coll_warnings, w[at:] = w[at:], []
        sr = A.safe(w, "step_rank", lambda: _unless(self.failed.get("step_rank"), lambda: (
            SS.write_step_rank(tr, self.path["step_rank"], self.parts, pipe))), None)
        w.extend(coll_warnings)
        self.parts = []

        def axis() -> dict:
            return _unless(self.failed.get("axis"), self.sums.result)
        return sr, n_coll or 0, axis, (self.out.late if n_coll is not None else Lateness())

    def _flush(self) -> None:
        b = self.stream.flush()
        if b is not None:
            self.out.write(b)
        self.ended = True


def one_read(tr: Traces, out_dir: Path, path: dict, sampler=None,
             resume: OneRead | None = None, hosts: dict | None = None, pipe=None):
    """OneRead.finish of every pass of the run in `out_dir` (`resume`: a OneRead fed the
    first passes already, by the live analysis: the rest read from its next step; `hosts`:
    links.rank_hosts', which the instances' links are taken with; `pipe`: finish's)."""
    if resume is None:
        reader = OneRead(tr, path, sampler, hosts)
        reader.read(out_dir)
    else:
        reader = resume
        reader.read(out_dir, start=reader.next_step)
    return reader.finish(tr, pipe)


def _unless(exc: Exception | None, fn):
    """fn(), unless a consumer of the read raised `exc` (raised again, for A.safe to say)."""
    if exc is not None:
        raise exc
    return fn()
