"""One run's analysis as the API serves it: the analysis document, a page of a table, a
table's rows streamed, the Perfetto document or a window of it, the Kineto traces and the
Gantt. The routes (api/routes/runs/analysis.py) call these. Every answer reads one columnar
trace by one engine: a finished run's own Parquet files, or a running run's scratch
conversion (run_traces.source); a large table lives in a Parquet file beside them
(jobs.analysis.engine), the Gantt and Perfetto windows are read from them (gantt_columnar).
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from backend.errors import Invalid, NotFound
from backend.services import gantt_columnar, run_traces
from backend.storage import resolve_run_path
from jobs.analysis import PERFETTO_FILE, engine, tables_to_csv
from jobs.analysis.export import iter_csv, iter_json_rows, iter_perfetto_json
from jobs.analysis.labels import csv_header
from jobs.analysis.perfetto import iter_perfetto_columnar


def _bad_query(field: str, msg: str) -> Invalid:
    return Invalid(msg, field=field, where="query")


class Download:
    """A download's body (text, or an iterator of text chunks), media type and file name;
    `path`: a stored file served as it is instead."""

    def __init__(self, name: str, media: str, body=None, path: Path | None = None):
        self.name, self.media, self.body, self.path = name, media, body, path

    @property
    def streamed(self) -> bool:
        return not isinstance(self.body, str)


class RunAnalysis:
    def __init__(self, runs_dir: Path, run):
        self.run, self.runs_dir, self.dir = run, runs_dir, runs_dir / run.id

    # --- the analysis and its tables ------------------------------------------------------
    def document(self) -> dict:
        """The stored analysis, or the partial traces' while the run goes (NotFound: none)."""
        return self._document()[0]

    def _document(self) -> tuple[dict, Path]:
        """(the analysis, the folder of its table files)."""
        a, where = run_traces.analysis(self.dir, self.run.spec)
        if a is None:
            raise NotFound(f"run {self.run.id} has no analysis yet (status {self.run.status}): "
                           "no trace has been written")
        return a, where

    def table_page(self, table: str, offset: int, limit: int | None) -> dict:
        """Rows [offset, offset + limit) of a table and its total: a large table's from its
        Parquet file, else from the document."""
        a, where = self._document()
        if table in (a.get("table_files") or {}):
            total, rows = engine.table_rows(where, table, offset, limit)
        else:
            every = (a.get("tables") or {}).get(table, [])
            total = len(every)
            rows = every[offset:None if limit is None else offset + limit]
        return {"run_id": self.run.id, "table": table, "total": total, "offset": offset,
                "rows": rows}

    def table_download(self, fmt: str, table: str | None) -> Download:
        """The analysis (table None, json) or one whole table as json / csv, its CSV header
        labelled with units; a large table streamed a row group at a time."""
        a, where = self._document()
        rid = self.run.id
        if table is None:
            return Download(f"paralab-{rid}-analysis.json", "application/json", json.dumps(a))
        unit = (a.get("headline") or {}).get("throughput_unit")
        name = f"paralab-{rid}-{table}.{fmt}"
        if table in (a.get("table_files") or {}):  # whole, not the document's sample
            batches = engine.iter_table_rows(where, table)
            if fmt == "csv":
                cols = engine.table_header(where, table)
                return Download(name, "text/csv",
                                iter_csv(batches, cols, csv_header(table, cols, unit)))
            return Download(name, "application/json", iter_json_rows(batches))
        rows = (a.get("tables") or {}).get(table, [])
        if fmt == "csv":
            return Download(name, "text/csv", tables_to_csv({table: rows}, table, unit))
        return Download(name, "application/json", json.dumps(rows))

    # --- Perfetto ---------------------------------------------------------------------------
    def perfetto(self, window_ms: tuple[float, float] | None = None) -> Download:
        """The whole run's Perfetto document, or the records overlapping a window: built on
        request (never stored any more) from the columnar traces, rank by rank (a window
        from the row groups it overlaps); a run analysed before that serves its stored file."""
        rid, spec = self.run.id, self.run.spec
        if window_ms is not None:
            t0, t1 = window_ms
            name = f"paralab-{rid}-{t0:g}-{t1:g}ms.perfetto.json"
            try:
                tr, origin = gantt_columnar.export_window(self._source(), t0, t1)
            except ValueError as exc:
                raise _bad_query("t1_ms", str(exc)) from None
            return Download(name, "application/json", iter_perfetto_json(
                tr, spec, window_ms=window_ms, origin=origin))
        name = f"paralab-{rid}.perfetto.json"
        stored = resolve_run_path(self.runs_dir, rid, PERFETTO_FILE)
        if stored.is_file():
            return Download(name, "application/json", path=stored)
        chunks = iter_perfetto_columnar(self._source(), spec)
        try:  # a rank too large to build is refused before the first byte
            first = next(chunks)
        except ValueError as exc:
            raise _bad_query("t0_ms", str(exc)) from None
        return Download(name, "application/json", itertools.chain([first], chunks))

    # --- Kineto (HTA / TensorBoard) ----------------------------------------------------------
    def kineto(self, rank: int | None = None) -> Download:
        """The run's PyTorch-profiler-shaped traces (jobs.analysis.kineto_export): a streamed
        .zip of `rank{R}.pt.trace.json`, or one rank's document, read from the columnar
        traces rank by rank."""
        from jobs.analysis import kineto_download as KD
        rid = self.run.id
        if self.run.kind == "import":  # its own profiler traces, byte for byte
            return self._imported_kineto(KD, rank)
        run = KD.open_run(self._source())
        if rank is not None and rank not in run.ranks:
            raise _bad_query("rank", f"run {rid} has no rank {rank} (ranks: "
                             f"{', '.join(map(str, run.ranks)) or 'none'})")
        try:  # a rank too large to build is refused before the first byte
            run.check_size()
        except ValueError as exc:
            raise _bad_query("rank", str(exc)) from None
        if rank is not None:
            return Download(f"paralab-{rid}-{KD.member_name(rank)}", "application/json",
                            KD.iter_rank(run, rank))
        return Download(f"paralab-{rid}.kineto.zip", "application/zip", KD.iter_run_zip(run))

    def _imported_kineto(self, KD, rank: int | None) -> Download:
        files = KD.imported_files(self.dir)
        if rank is not None:
            if rank not in files:
                raise _bad_query("rank", f"run {self.run.id} has no rank {rank} (ranks: "
                                 f"{', '.join(map(str, files)) or 'none'})")
            path = files[rank]
            return Download(KD.imported_name(path), "application/gzip"
                            if path.name.endswith(".gz") else "application/json", path=path)
        return Download(f"paralab-{self.run.id}.kineto.zip", "application/zip",
                        KD.iter_imported_zip(files))

    # --- the Gantt --------------------------------------------------------------------------
    def gantt(self, *, step, t0_ms, t1_ms, max_spans: int, px: int) -> dict:
        """Per-rank segments of a window (only the window's records read)."""
        return gantt_columnar.answer(self._source(), step=step, t0_ms=t0_ms, t1_ms=t1_ms,
                                     max_spans=max_spans, px=px)

    def gantt_steps(self) -> dict:
        """The trace's optimizer steps and their windows, without any span."""
        info = gantt_columnar.run_info(self._source())
        return {"steps": gantt_columnar.listed_steps(info["steps"]),
                "steps_total": len(info["steps"]), "ranks": len(info["meta"].ranks),
                "spans": None}  # not counted: the run is read one window at a time

    def _source(self) -> Path:
        src = run_traces.source(self.dir)
        if src is None:
            raise NotFound(f"run {self.run.id} has no trace files (yet; status "
                           f"{self.run.status})")
        return src
