"""The Kineto export of a run as a download: one rank's document, or a .zip of every rank's
`rank{R}.pt.trace.json` (the layout HTA's TraceAnalysis(trace_dir=...) and the TensorBoard
profiler plugin read), streamed.

A converted run is read from its Parquet traces with perfetto.py's reading path, one rank
when its turn comes, so memory holds one rank's records; a rank of more than
perfetto.RANK_MAX_RECORDS records is refused (ValueError) before anything is sent. A run not
converted yet (JSON lines, already loaded) is read from its Traces. The zip is written to a
non-seekable sink (zip64 members with data descriptors) and handed out in pieces of about
ZIP_FLUSH bytes.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

from . import perfetto
from .kineto_export import iter_rank_json
from .storage.load import Traces

ZIP_FLUSH = 1 << 20


class ColumnarRun:
    """A converted run: ranks and meta from the Parquet files' metadata, records on demand."""

    def __init__(self, run_dir: Path):
        from . import trace_sql as V
        self.dir = Path(run_dir)
        self.meta: Traces = V.meta_only(self.dir)
        self.t0 = perfetto.origin_ns(self.dir, self.meta)
        self.ranks = sorted(self.meta.ranks)

    def check_size(self) -> None:
        """ValueError when a rank holds more records than one download builds at once."""
        from . import trace_sql as V
        con = V.connect(self.dir)
        try:
            counts = dict(con.execute("SELECT rank, count(*) FROM t GROUP BY rank").fetchall())
        finally:
            con.close()
        big = {r: n for r, n in counts.items() if n > perfetto.RANK_MAX_RECORDS}
        if big:
            r, n = max(big.items(), key=lambda x: x[1])
            raise ValueError(f"rank {r} holds {n:,} trace records, more than one download "
                             f"builds at once ({perfetto.RANK_MAX_RECORDS:,}): export a "
                             "window in Perfetto format instead")

    def records(self, rank: int) -> list[dict]:
        from . import trace_sql as V
        con = V.connect(self.dir)
        try:
            return perfetto._rank_records(con, rank)
        finally:
            con.close()


class LoadedRun:
    """A run whose records are in memory (load.Traces: JSON lines, or a test's records)."""

    def __init__(self, traces: Traces):
        self.meta = traces
        self.t0 = traces.t0_ns()
        self.ranks = sorted(traces.ranks)

    def check_size(self) -> None:
        return None  # already loaded

    def records(self, rank: int) -> list[dict]:
        return self.meta.ranks[rank]


def open_run(run_dir: Path | None = None, traces: Traces | None = None):
    """The run to export: its Parquet traces when given a converted folder, else `traces`."""
    from .storage.columnar import has_columnar
    if run_dir is not None and has_columnar(Path(run_dir)):
        return ColumnarRun(Path(run_dir))
    if traces is None:
        raise ValueError("no converted traces in the folder and no loaded traces given")
    return LoadedRun(traces)


def iter_rank(run, rank: int, chunk: int = 2000):
    """One rank's document as text chunks; its records are read when the first is asked."""
    yield from iter_rank_json(run.meta, rank, run.records(rank), run.t0, chunk)


def member_name(rank: int) -> str:
    return f"rank{rank}.pt.trace.json"


class _Sink:
    """A write-only, non-seekable byte sink (zipfile then writes data descriptors)."""

    def __init__(self):
        self.parts: list[bytes] = []
        self.size = 0

    def write(self, b) -> int:
        self.parts.append(bytes(b))
        self.size += len(b)
        return len(b)

    def flush(self) -> None:
        pass

    def take(self) -> bytes:
        out = b"".join(self.parts)
        self.parts, self.size = [], 0
        return out


def iter_zip(members, level: int = 6):
    """A .zip of `members` ((name, iterator of text or byte chunks), consumed one after the
    other) as byte pieces: never more than about one chunk plus ZIP_FLUSH bytes held."""
    sink = _Sink()
    with zipfile.ZipFile(sink, "w", zipfile.ZIP_DEFLATED, compresslevel=level) as zf:
        for name, chunks in members:
            with zf.open(name, "w", force_zip64=True) as f:
                for c in chunks:
                    f.write(c if isinstance(c, bytes) else c.encode())
                    if sink.size >= ZIP_FLUSH:
                        yield sink.take()
            yield sink.take()
    yield sink.take()


def iter_run_zip(run):
    """Every rank's document of `run` in one zip, rank by rank."""
    return iter_zip((member_name(r), iter_rank(run, r)) for r in run.ranks)


def file_chunks(path: Path, size: int = ZIP_FLUSH):
    with open(path, "rb") as f:
        while chunk := f.read(size):
            yield chunk


def imported_files(run_dir: Path) -> dict[int, Path]:
    """An import run's own profiler traces (kept as `kineto/rank{R}.json[.gz]`): rank -> path."""
    out = {}
    for p in Path(run_dir, "kineto").glob("rank*"):
        digits = p.name[4:].split(".", 1)[0]
        if digits.isdigit():
            out[int(digits)] = p
    return dict(sorted(out.items()))


def imported_name(path: Path) -> str:
    return path.name.replace(".json", ".pt.trace.json", 1)


def iter_imported_zip(files: dict[int, Path]):
    """The import's own traces in one zip, byte for byte (each read when its turn comes)."""
    return iter_zip((imported_name(p), file_chunks(p)) for p in files.values())
