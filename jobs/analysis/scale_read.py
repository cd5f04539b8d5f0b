"""The scale path's one read (issue 19): each rank file decoded once per step range
(np_read), its rows feeding the three consumers of record-scale data in one pass:

    the step sweep     np_steps.rows_of   -> scale_steps.write_step_rank (table-step_rank)
    the collectives    np_coll.comm_table -> scale_comm.write_instances (table-collectives)
    the axis sums      np_axis.Sums       -> axis_bytes and links

with the setup records (a null or negative step) read once for the collectives' first pass
and the setup bytes. Reading the files three times (two per-rank reads and a DuckDB scan)
cost a fifth of the whole analysis at 50 M records (docs/benchmarks.md).
"""

from __future__ import annotations

from pathlib import Path

from . import assemble as A
from .load import Traces


def one_read(tr: Traces, out_dir: Path, path: dict, sample=None):
    """(step_rank table or None, collective instances, axis) with the two tables written to
    path["step_rank"] and path["collectives"] (`sample`: called with each instance batch);
    `axis`: a callable giving np_axis.axis_sums' result or raising what computing it raised.
    Warnings in the Python path's order (step_rank's, then the collectives'). A consumer that
    raises stops and its table is left out with the reason; the others go on. Should the
    instances fail, their partial file is removed and the step_rank table and the axis sums
    are computed from reads of their own."""
    from . import np_axis as NA
    from . import np_coll as NC
    from . import np_read
    from . import np_steps as NS
    from . import scale_comm as SC
    from . import scale_steps as SS
    w = tr.warnings
    files = np_read.open_files(out_dir, NS.COLS + NC.COLS + NA.COLS,
                               NS.DICT + NC.DICT + NA.DICT)
    parts: list = []
    sums = NA.Sums()
    failed: dict[str, Exception] = {}  # consumer -> what it raised: it stops, the rest goes on

    def guard(name: str, fn) -> None:
        if name not in failed:
            try:
                fn()
            except Exception as exc:  # noqa: BLE001 - said as that table's, by A.safe below
                failed[name] = exc

    def feed(tabs: dict, train: bool) -> None:
        for rank, t in sorted(tabs.items()):
            guard("axis", lambda rank=rank, t=t: sums.add(rank, t, train))

    def passes():  # the setup records' pass (carry step -2), then each step range's
        for lo, hi, tabs in np_read.scan(files, NS.CHUNK_RECORDS):
            if lo is not None:
                guard("step_rank", lambda tabs=tabs, lo=lo: parts.extend(NS.rows_of(tabs, lo)))
            feed(tabs, lo is not None)
            yield -2 if hi is None else hi, NC.comm_table(tabs)

    at = len(w)
    n_coll = A.safe(w, "collectives", lambda: SC.write_instances(
        tr, out_dir, path["collectives"], sample, passes()), None)
    whole = n_coll is not None
    if not whole:  # a part of the instances: no table may read them
        Path(path["collectives"]).unlink(missing_ok=True)
    coll_warnings, w[at:] = w[at:], []
    sr = A.safe(w, "step_rank", lambda: _unless(failed.get("step_rank"), lambda: (
        SS.write_step_rank(tr, path["step_rank"], parts if whole else None))), None)
    w.extend(coll_warnings)

    def axis() -> dict:
        return _unless(failed.get("axis"),
                       lambda: sums.result() if whole else NA.axis_sums(out_dir))
    return sr, n_coll or 0, axis


def _unless(exc: Exception | None, fn):
    """fn(), unless a consumer of the read raised `exc` (raised again, for A.safe to say)."""
    if exc is not None:
        raise exc
    return fn()
