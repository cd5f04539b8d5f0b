"""The analysis while the run goes: the engine's one read (one_read.OneRead:
the step sweep, the collective instances, the axis sums) fed with the row groups the live
conversion writes (convert_live.py), so that after the run only its last steps and the
small tables over the results are left (engine.analyze_columnar resumes from here).

Each row group the live conversion writes reaches `add` as written: its rows as step_ranges
would read them back (the same columns, strings as dictionaries, `row` the file row), held
per rank until every rank of the run has passed their step. Steps lo..hi are fed as one
pass once every rank has written a row of step hi + SLACK_STEPS (the conversion writes by
time, so a rank's rows of a step are all written once it is that far ahead) and the passes
ready hold at least MIN_PASS_ROWS rows; the setup records' pass (a null or negative step)
comes first, as the post-run read gives it.

The slack is an expectation, not a guarantee, so every row written later is checked: a row
of a step already fed, a comm or MoE record of the setup after its pass, a rank whose live
conversion was given up (its Parquet file then comes from the post-run conversion), a rank
whose meta record differs after the run, or rows held beyond MAX_HELD_ROWS (a rank that
writes no rows, or far behind the others) give the live analysis up: its instance file is
removed and the post-run analysis reads every pass, as it did before. The same happens to a
run with point-to-point ops (a pipeline's sends and receives: the post-run read matches them
whole), and to one whose ranks are not all on this host (a multi-host run's node: the worker
does not start it there).

What is fed is what the post-run read would have fed, pass for pass in step order, so the
analysis is the post-run one (tests/analysis/test_analyze_live.py compares them whole).
"""

from __future__ import annotations

import logging
from pathlib import Path

from jobs import commbytes

from .storage import columnar as C
from .storage.load import Traces
from .storage.step_ranges import read_columns

log = logging.getLogger(__name__)

SLACK_STEPS = 2  # a step is fed once every rank has written a row this many steps later
MIN_PASS_ROWS = 1 << 16  # rows (all ranks) a pass holds at least, unless the run ends
MAX_HELD_ROWS = 1 << 21  # rows held over all ranks; beyond, the live analysis is given up
RARE_SETUP = ("comm", "moe")  # the setup record types the setup pass reads (instances, axis_sums)


class _Rank:
    """One rank's rows written but not fed yet: its row groups as step_ranges gives them."""

    def __init__(self):
        self.tabs: list = []
        self.top = -1  # the highest step of its rows written


class LiveAnalysis:
    """Fed by convert_live.LiveRun (`add` per row group written, `advance` after each round
    of its poll); read after the run by engine.analyze_columnar (`resume`)."""

    def __init__(self, out_dir: Path):
        from . import engine
        from . import one_read as SR
        self.out = Path(out_dir)
        self.path = {n: self.out / engine.FILE.format(n) for n in engine.BIG}
        cols, dicts = SR.columns()
        names = C.arrow_schema().names  # what step_ranges.RankFile reads of a converter's file
        self.columns = read_columns(names, cols)
        self.dicts = {c for c in dicts if c in names}
        self.ranks: dict[int, _Rank] = {}
        self.metas: dict[int, dict] = {}
        self.reader = None  # one_read.OneRead, from the first pass on
        self.hosts: dict | None = None  # what its links are taken with
        self.sampler = engine.Sampler()
        self.failed: str | None = None
        self.resumed = 0  # once the post-run read went on from it: the first step it read

    # -- while the run goes ---------------------------------------------------------------------
    def add(self, rank: int, first_row: int, table) -> None:
        """A row group of `rank`'s Parquet file as written (columnar.arrow_schema), its
        first row's number in the file: checked, and held until its steps are fed."""
        if self.failed is not None:
            return
        try:
            self._add(rank, first_row, table, hold=True)
        except Exception as exc:  # noqa: BLE001 - the post-run analysis reads every pass
            self.fail(f"{type(exc).__name__}: {exc}")

    def check(self, rank: int, first_row: int, table) -> None:
        """A row group written after the run (convert_live.LiveRank.finish: the rest of the
        rank's rows, which the post-run read reads from the step the live passes did not
        reach): only checked, since a row of a step fed already would be missed."""
        if self.failed is not None:
            return
        try:
            self._add(rank, first_row, table, hold=False)
        except Exception as exc:  # noqa: BLE001
            self.fail(f"{type(exc).__name__}: {exc}")

    def _add(self, rank: int, first_row: int, table, hold: bool) -> None:
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        from .step_sweep import codes
        cols = self.columns if hold else ("step", "type", "op")  # what is checked
        t = pa.table({c: pc.dictionary_encode(table[c]) if c in self.dicts else table[c]
                      for c in cols})
        if hold:  # the file row, as step_ranges numbers it
            t = t.append_column("row", pa.array(np.arange(first_row, first_row + t.num_rows,
                                                          dtype=np.int64)))
        step = np.asarray(t["step"].fill_null(-1).to_numpy(zero_copy_only=False), np.int64)
        if self.reader is not None:
            train = step[step >= 0]
            nxt = self.reader.next_step
            if len(train) and int(train.min()) < nxt:
                raise ValueError(f"rank {rank} wrote a row of step {int(train.min())} after "
                                 f"steps up to {nxt - 1} were analysed")
            setup = step < 0
            if setup.any() and codes(t["type"], RARE_SETUP)[setup].any():
                raise ValueError(f"rank {rank} wrote a setup record after the setup pass")
            if setup.any():  # what the setup pass does not read: not held
                t = t.filter(pa.array(~setup))
                step = step[~setup]
        if codes(t["op"], commbytes.P2P_OPS).any():
            raise ValueError("point-to-point ops (the post-run analysis matches them)")
        if not hold:
            return
        r = self.ranks.setdefault(rank, _Rank())
        r.tabs.append(t)
        r.top = max(r.top, int(step.max(initial=-1)))
        held = sum(t.num_rows for x in self.ranks.values() for t in x.tabs)
        if held > MAX_HELD_ROWS:
            raise ValueError(f"more than {MAX_HELD_ROWS:,} rows held (a rank far behind the "
                             "others, or without rows)")

    def advance(self, metas: dict[int, dict]) -> None:
        """Feed the passes every rank has gone past (`metas`: each rank file's meta record so
        far, rank -> meta)."""
        if self.failed is not None:
            return
        try:
            self._advance(metas)
        except Exception as exc:  # noqa: BLE001
            self.fail(f"{type(exc).__name__}: {exc}")

    def _advance(self, metas: dict[int, dict]) -> None:
        import numpy as np
        if not self._whole(metas):
            return
        ready = min(r.top for r in self.ranks.values()) - SLACK_STEPS
        lo = self.reader.next_step if self.reader is not None else 0
        if ready < lo:
            return
        per_step = np.zeros(ready - lo + 1, np.int64)  # rows of each step ready, all ranks
        for r in self.ranks.values():
            for t in r.tabs:
                s = np.asarray(t["step"].fill_null(-1).to_numpy(zero_copy_only=False))
                s = s[(s >= lo) & (s <= ready)] - lo
                per_step += np.bincount(s, minlength=len(per_step))
        if per_step.sum() < MIN_PASS_ROWS:
            return
        if self.reader is None:
            self._setup()
        from . import step_sweep as NS
        at = lo
        while at <= ready:  # passes of about CHUNK_RECORDS rows, at least a step each
            cum = np.cumsum(per_step[at - lo:])
            hi = at + max(0, int(np.searchsorted(cum, NS.CHUNK_RECORDS, side="right")) - 1)
            self.reader.feed(at, hi, self._take(lambda s, a=at, b=hi: (s >= a) & (s <= b)))
            at = hi + 1

    def _whole(self, metas: dict[int, dict]) -> bool:
        """Every rank of the run has a file here, with its meta record and rows."""
        if not metas or not all(metas.values()):
            return False
        sizes = {m.get("world_size") for m in metas.values()}
        if len(sizes) != 1 or not isinstance(world := next(iter(sizes)), int):
            return False
        if set(metas) != set(range(world)) or set(self.ranks) != set(metas):
            return False
        if self.metas and self.metas != metas:
            raise ValueError("a rank's meta record changed")
        self.metas = dict(metas)
        return True

    def _setup(self) -> None:
        from . import links as LK
        from . import one_read as SR
        from .predicted import spec_of
        tr = Traces(ranks={r: [] for r in self.metas}, meta=dict(self.metas))
        # the links are taken with the hosts of the meta's spec: resume checks the post-run
        # analysis' are the same
        self.hosts = LK.rank_hosts(tr, spec_of(tr.spec_dict(), []))[0]
        self.reader = SR.OneRead(tr, self.path, self.sampler, self.hosts)
        self.reader.feed(None, None, self._take(lambda s: s < 0))

    def _take(self, which) -> dict:
        """{rank: its held rows whose step (null: -1) `which` selects}, removed from those
        held; ranks without any left out."""
        import numpy as np
        import pyarrow as pa
        out = {}
        for rank in sorted(self.ranks):
            r = self.ranks[rank]
            if not r.tabs:
                continue
            t = pa.concat_tables(r.tabs) if len(r.tabs) > 1 else r.tabs[0]
            s = np.asarray(t["step"].fill_null(-1).to_numpy(zero_copy_only=False))
            m = which(s)
            if m.all():
                out[rank], r.tabs = t, []
            elif m.any():
                out[rank], r.tabs = t.filter(pa.array(m)), [t.filter(pa.array(~m))]
        return out

    def fail(self, why: str) -> None:
        """Give the live analysis up: the post-run analysis reads every pass."""
        if self.failed is None:
            log.info("%s: live analysis given up (%s); analysed after the run", self.out, why)
            self.failed = why
        self.ranks = {}
        if self.reader is not None:
            self.reader.discard()
            self.reader = None

    # -- after the run --------------------------------------------------------------------------
    def resume(self, out_dir: Path, tr: Traces, path: dict, hosts: dict):
        """The OneRead fed so far, for the post-run read to go on from (its next_step), or
        None (given up, or nothing fed): then every pass is read after the run. `tr`: the
        post-run meta Traces of the Parquet files, which must hold the same ranks and meta
        records; `path`: the post-run tables' files; `hosts`: the post-run analysis' rank
        hosts (links.rank_hosts of its spec), which must be those the links were taken
        with."""
        why = self.failed or self._unlike(out_dir, tr, path, hosts)
        if why is not None:
            self.fail(why)
            return None
        reader, self.reader, self.ranks = self.reader, None, {}
        self.resumed = reader.next_step
        return reader

    def _unlike(self, out_dir: Path, tr: Traces, path: dict, hosts: dict) -> str | None:
        """Why the post-run analysis cannot go on from the passes fed (None: it can)."""
        if self.reader is None:
            return "no pass was fed while the run went"
        if Path(out_dir) != self.out or {k: Path(v) for k, v in path.items()} != self.path:
            return "another folder or other table files"
        if {r: tr.meta.get(r) for r in tr.ranks} != self.metas:
            return "the Parquet files' ranks or meta records differ"
        if hosts != self.hosts:
            return "the post-run analysis' spec places the ranks on other hosts"
        if self.reader.failed:
            return f"{', '.join(self.reader.failed)} raised while the run went"
        return None

    def discard(self, why: str = "not used") -> None:
        """After the run, where the engine did not resume from it:
        its instance file removed (a no-op once resumed)."""
        if self.reader is not None or self.ranks:
            self.fail(why)
