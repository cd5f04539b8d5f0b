"""The conversion to Parquet while the run goes: the worker reads each rank's new
blocks (jobs/trace_blocks.py) every few seconds and writes the row groups that can no longer
change, so after the run only the last steps are left to convert.

A row group is final once no record still to come can sort before its rows. The tracer
appends a span when it ends, so a record still to come started inside a span still open:
a rank's open spans began after the start of its last completed `step` span. The watermark
is therefore the start of the second-to-last completed step (one step of slack, for a
device record resolved late), and the rows sorting below it are written, a full group
(ROW_GROUP_ROWS) at a time, in the order the post-run conversion gives them (records by
`ts_ns`, ties in line order). A rank without step spans writes nothing live.

The watermark is an expectation, not a guarantee (a user's span across steps breaks it), so
every new record is checked against the last row written: one that sorts before it, a block
that does not chain from the last (`j0`), a second meta record, a killed rank (its lines
after its blocks), bad lines, or a decoding error give the rank up: its live file is removed
and the post-run conversion (convert.py) converts it whole, as it did before. What is
written is the post-run file, row group for row group and metadata for metadata
(tests/analysis/test_convert_live.py).

Memory: the decoded blocks whose rows are not all written, about a step and a row group
per rank.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from jobs import trace_blocks as TB

from . import blocks as B
from . import columnar as C
from .convert import take_rows
from .jsonl import _RANK_RE

log = logging.getLogger(__name__)

SUFFIX = ".live"  # beside the Parquet file it becomes (dest + SUFFIX) until the run ends
FIRST_BYTES = 1 << 20
# rows held at most per rank (decoded, about 0.2 KB each): beyond, the rank is given up,
# so a run without step spans (the watermark) costs the worker bounded memory
MAX_HELD_ROWS = 1 << 20
STEP_CAT = "step"  # the `cat` of the training loop's step span (jobs/loop.py)


class LiveRank:
    """One rank file's conversion as its blocks arrive: `poll` while the run goes,
    `finish` once no rank appends (True: the Parquet file is written)."""

    def __init__(self, jsonl: Path, rank: int):
        self.jsonl, self.rank = Path(jsonl), rank
        self.bp = TB.blocks_path(self.jsonl)
        self.dest = C.parquet_path(self.jsonl)
        self.part = self.dest.with_name(self.dest.name + SUFFIX)
        self.off = 0  # the blocks file's bytes read (whole blocks)
        self.j = 0  # the JSON file's bytes those blocks hold (their last j1)
        # the file's first bytes (its first block): a restarted attempt rewrites the file,
        # which a size that only grew would not show
        self.first: bytes | None = None
        self.state = {"meta": {}, "bad": 0, "seen": False}
        # per block not all written: (sort keys, Arrow rows, the rows not yet written)
        self.held: list = []
        self.steps: list[int] = []  # the last two completed step spans' starts
        self.writer = None
        self.md: dict | None = None  # the metadata the live file was opened with
        self.last: int | None = None  # the last written row's sort key
        self.rows = 0  # rows written
        self.failed: str | None = None
        # called with (rank, first row, table) per row group written while the run goes
        # (analyze_live.LiveAnalysis.add); None after the run
        self.sink = None
        self.more = False  # the last poll stopped at its block limit: more blocks to read

    def poll(self, stop=None, blocks: int | None = None) -> int:
        """Read the blocks written since the last poll and write what became final; returns
        the rows written. Never raises: a failure gives the rank up (see the module doc).
        `stop`: a threading.Event checked between blocks (the rest is read next time);
        `blocks`: read at most this many (`more` says whether some are left)."""
        self.more = False
        if self.failed is not None:
            return 0
        before = self.rows
        try:
            self._read(stop, blocks)
        except Exception as exc:  # noqa: BLE001 - the post-run conversion still answers
            self._give_up(f"{type(exc).__name__}: {exc}")
        return self.rows - before

    def _read(self, stop=None, blocks: int | None = None) -> None:
        if not self.bp.exists():
            return
        read = 0
        with open(self.bp, "rb") as f:
            if os.fstat(f.fileno()).st_size < self.off:
                raise ValueError("the blocks file shrank")
            if self.first is not None:
                if f.read(len(self.first)) != self.first:
                    raise ValueError("the blocks file was rewritten (a restarted attempt)")
            f.seek(self.off)
            for head, body in TB.read_blocks(f):
                if stop is not None and stop.is_set():
                    return  # this block is read again next time (self.off not moved)
                if blocks is not None and read == blocks:
                    self.more = True  # as a stop: read again next time
                    return
                read += 1
                self.off = f.tell()
                if head.get("j0") != self.j:
                    raise ValueError(f"a block starts at {head.get('j0')}, not {self.j}")
                self.j = head["j1"]
                if self.first is None:  # its meta record: another attempt's differs
                    f.seek(0)
                    self.first = f.read(min(self.off, FIRST_BYTES))
                    f.seek(self.off)
                self._add(head, body)
                self._write(self._watermark())

    def _add(self, head: dict, body: bytes) -> None:
        meta = self.state["meta"]
        if head["n"]:
            self.state["seen"] = True
        table, keys = B._block(head, body, self.rank, self.state)
        if self.md is not None and self.state["meta"] is not meta:
            raise ValueError("a second meta record")
        if table is None:
            return
        if self.last is not None and int(keys.min()) < self.last:
            raise ValueError("a record sorts before the rows written")
        import numpy as np
        self.held.append((keys, table, np.arange(len(keys))))
        if self._held_rows() > MAX_HELD_ROWS:
            raise ValueError(f"more than {MAX_HELD_ROWS:,} rows held (no step spans to "
                             "write them by)")
        import pyarrow.compute as pc
        steps = pc.and_(pc.equal(table["type"], "span"), pc.equal(table["cat"], STEP_CAT))
        starts = pc.filter(table["ts_ns"], pc.fill_null(steps, False)).to_pylist()
        self.steps = sorted(set(self.steps) | set(starts))[-2:]

    def _watermark(self) -> int | None:
        return self.steps[0] if len(self.steps) == 2 else None

    def _write(self, below: int | None, everything: bool = False) -> None:
        """The full row groups of held rows sorting below `below` (`everything`: all held
        rows, the last group short)."""
        import numpy as np
        R = C.ROW_GROUP_ROWS
        if not self.held:
            return
        if not everything and (below is None or self._held_rows() < R):
            return
        # the held rows in line order (what the post-run stable argsort sees of them), and
        # where each is in the held tables side by side
        keys = np.concatenate([k[left] for k, _, left in self.held])
        base = np.cumsum([0] + [t.num_rows for _, t, _ in self.held])[:-1]
        where = np.concatenate([b + left for b, (_, _, left) in zip(base, self.held,
                                                                     strict=True)])
        n = len(keys) if everything else int((keys < below).sum()) // R * R
        if not n:
            return
        order = np.argsort(keys, kind="stable")[:n]
        if self.writer is None:
            self._open()
        tables = [t for _, t, _ in self.held]
        for g in range(0, n, R):
            group = take_rows(tables, where[order[g:g + R]])
            self.writer.write_table(group, row_group_size=R)
            if self.sink is not None:
                self.sink(self.rank, self.rows + g, group)
        self.last = int(keys[order[-1]])
        self.rows += n
        done = np.zeros(len(keys), bool)
        done[order] = True
        kept, at = [], 0
        for k, t, left in self.held:  # a block stays, with the rows it has left
            mine = done[at:at + len(left)]
            at += len(left)
            if not mine.all():
                kept.append((k, t, left[~mine]))
        self.held = kept

    def _held_rows(self) -> int:
        return sum(len(left) for _, _, left in self.held)

    def _open(self) -> None:
        import pyarrow.parquet as pq
        self.md = C.file_metadata(self.state["meta"], 0, False, "blocks")
        schema = C.arrow_schema().with_metadata(self.md)
        self.writer = pq.ParquetWriter(self.part, schema, **C.write_options(schema.names))

    def finish(self) -> bool:
        """After the run: the rest of the blocks and every held row, and the live file
        becomes the Parquet file (its blocks file removed). False (nothing written) when the
        rank was given up, holds no row, or its file does not end as its blocks do: the
        post-run conversion then converts it whole."""
        try:
            whole = self.failed is None and B.usable(self.jsonl) == self.bp
            if whole:
                self._read()  # what came since the last poll, written as it is read
                if self.j != self.jsonl.stat().st_size:
                    raise ValueError("the blocks do not hold the whole file")
                self._write(None, everything=True)
            if whole and self.failed is None and self.writer is not None:
                md = C.file_metadata(self.state["meta"], self.state["bad"],
                                     not self.state["seen"], "blocks")
                if md != self.md:
                    raise ValueError("the file's metadata changed after it was opened")
                self.writer.close()
                self.writer = None
                os.replace(self.part, self.dest)
                self.bp.unlink(missing_ok=True)
                return True
            self._give_up(self.failed or "no rows, or lines after the blocks")
        except Exception as exc:  # noqa: BLE001
            self._give_up(f"{type(exc).__name__}: {exc}")
        return False

    def _give_up(self, why: str) -> None:
        if self.failed is None and self.writer is not None:
            log.info("%s: live conversion given up (%s); converted after the run", self.jsonl,
                     why)
        self.failed = why
        if self.writer is not None:
            try:
                self.writer.close()
            except Exception:  # noqa: BLE001 - the file is removed either way
                pass
            self.writer = None
        self.part.unlink(missing_ok=True)
        self.held = []


class LiveRun:
    """Every rank file of a run folder (those that appear later too): what the worker polls
    while the job runs and hands to convert.convert_run_dir after it. `analyse`: the row
    groups written also feed the analysis (analyze_live.LiveAnalysis, `analysis`), and the
    ranks are polled ROUND_BLOCKS blocks at a time in turn, so that they advance together
    (the analysis holds a rank's rows until every rank has passed their steps)."""

    ROUND_BLOCKS = 8

    def __init__(self, out_dir: Path, analyse: bool = False):
        self.out = Path(out_dir)
        self.ranks: dict[int, LiveRank] = {}
        self.finished: dict[int, int] = {}  # rank -> rows written while the run went
        self.given_up: dict[int, str] = {}  # rank -> why the post-run conversion took it
        self.analysis = None
        if analyse:
            from ..analyze_live import LiveAnalysis
            self.analysis = LiveAnalysis(self.out)

    def poll(self, stop=None) -> int:
        """Every rank's poll; `stop` (a threading.Event) ends it early, between blocks."""
        for path in sorted(self.out.glob("trace-rank*.jsonl")):
            m = _RANK_RE.search(path.name)
            if m and int(m.group(1)) not in self.ranks:
                live = LiveRank(path, int(m.group(1)))
                if self.analysis is not None:
                    live.sink = self.analysis.add
                self.ranks[int(m.group(1))] = live
        if self.analysis is None:
            return sum(r.poll(stop) for r in self.ranks.values())
        rows = 0
        while True:
            rows += sum(r.poll(stop, self.ROUND_BLOCKS) for r in self.ranks.values())
            self._analyse()
            if not any(r.more for r in self.ranks.values()) or (stop is not None and
                                                                stop.is_set()):
                C.release_memory()  # the passes' freed buffers, not kept by the worker
                return rows

    def _analyse(self) -> None:
        a = self.analysis
        for rank, live in self.ranks.items():
            if live.failed is not None:
                a.fail(f"rank {rank}'s live conversion was given up ({live.failed})")
        a.advance({rank: live.state["meta"] for rank, live in self.ranks.items()})

    def finish(self, rank: int) -> bool:
        live = self.ranks.pop(rank, None)
        if live is None:
            return False
        # the rows written now are read from the Parquet file after the run: only checked
        live.sink = self.analysis.check if self.analysis is not None else None
        rows = live.rows
        if live.finish():
            self.finished[rank] = rows
            return True
        self.given_up[rank] = live.failed
        if self.analysis is not None:
            self.analysis.fail(f"rank {rank}'s live conversion was given up ({live.failed})")
        return False

    def close(self) -> None:
        """Whatever was not finished is removed (its live file)."""
        if self.ranks and self.analysis is not None:
            self.analysis.fail(f"rank(s) {sorted(self.ranks)} not finished live")
        for live in self.ranks.values():
            live._give_up("closed")
        self.ranks.clear()
