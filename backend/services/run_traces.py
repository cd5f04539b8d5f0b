"""A run's traces and analysis as the backend serves them, cached by file version.

The worker stores `analysis.json` (jobs.analysis.write_analysis) when a run ends; until then
(a running run, or one whose worker died before analysing) `jobs.analysis.analyze` runs here
over the partial trace files. Either way the run page reads one analysis: the backend
computes no metric of its own. A running run's Gantt columns (backend/services/gantt.py) are
derived from the same loaded traces (`jobs.analysis.load_run_dir`, the one trace loader); a
converted run's (every finished run) are read a window at a time from its Parquet files
(gantt_columnar.py), and its JSON lines are never parsed here.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from jobs.analysis import ANALYSIS_FILE, SCHEMA, Traces, analyze, load_run_dir

_CACHE: OrderedDict[tuple, RunTraces] = OrderedDict()
_LOCK = threading.Lock()
_LOAD_LOCK = threading.Lock()
# Memory of one loaded record with what is derived from it (the Gantt's columns, the
# analysis), measured by RSS growth: 1.55 KB on the ddp preset (load 1.30, Gantt 0.20,
# analysis 0.06), 2.3 KB on the gpt runs of docs/benchmarks.md; the larger is charged.
RECORD_BYTES = 2_300
LIMIT_BYTES = 256 << 20  # Settings.analysis_cache_mb, set by configure() at app start
_DROPPED = False  # a parse was let go (evicted, replaced, or too large to keep) since the trim


def configure(limit_mb: float) -> None:
    """The cache's byte bound (Settings.analysis_cache_mb); drops what no longer fits."""
    global LIMIT_BYTES
    LIMIT_BYTES = int(limit_mb * (1 << 20))
    with _LOCK:
        _evict()


@dataclass
class RunTraces:
    traces: Traces
    derived: dict = field(default_factory=dict)  # per-version cache: gantt columns, analysis
    lock: threading.Lock = field(default_factory=threading.Lock)
    nbytes: int = 0  # charged against LIMIT_BYTES


def cached_bytes() -> int:
    """What the cache holds now, as charged (health reports it)."""
    with _LOCK:
        return sum(rt.nbytes for rt in _CACHE.values())


def _evict(expected: int = 0) -> None:
    """Least recently used first, until the rest (and `expected` more bytes) fits (caller
    holds _LOCK)."""
    global _DROPPED
    total = sum(rt.nbytes for rt in _CACHE.values())
    while _CACHE and total + expected > LIMIT_BYTES:
        _, old = _CACHE.popitem(last=False)
        total -= old.nbytes
        _DROPPED = True


def _lines(files: list[Path]) -> int:
    """The trace files' lines (a record each, but the rank's header): what a parse will be
    charged, counted before it is made (a newline count: ~10 ms for 20 MiB)."""
    n = 0
    for p in files:
        try:
            with open(p, "rb") as f:
                while chunk := f.read(1 << 20):
                    n += chunk.count(b"\n")
        except OSError:
            pass  # (replaced meanwhile: the parse will say)
    return n


def _drop_older(key: tuple) -> None:
    """Drop the cached older versions of `key`'s run: never asked again (caller holds _LOCK)."""
    global _DROPPED
    for old in [k for k in _CACHE if k[0] == key[0] and k != key]:
        del _CACHE[old]
        _DROPPED = True


def _make_room(key: tuple, expected: int) -> None:
    """Before a parse that will be kept: drop this run's older versions and the least
    recently used runs until it fits beside the rest, so the process never holds the bound
    plus one parse (caller holds _LOCK). A parse too large to keep evicts nothing."""
    _drop_older(key)
    if expected <= LIMIT_BYTES:
        _evict(expected)


def trim_if_dropped() -> bool:
    """Hand the pages of the parses the cache let go back to the system (backend.core.memory:
    glibc keeps freed pages otherwise, and the API's RSS kept every high-water mark). Called
    every few seconds by the app (backend.main), so a parse that was served but too large to
    keep, freed when its request ended, is released too. True when it trimmed."""
    global _DROPPED
    with _LOCK:
        if not _DROPPED:
            return False
        _DROPPED = False
    from backend.core.memory import release_freed
    release_freed()
    return True


def trace_files(run_dir: Path) -> list[Path]:
    return sorted(run_dir.glob("trace-rank*.jsonl"))


def _version(run_dir: Path, files: list[Path]) -> tuple:
    extra = [p for p in (run_dir / "summary.json",) if p.is_file()]
    return (str(run_dir), tuple((p.name, p.stat().st_mtime_ns, p.stat().st_size)
                                for p in files + extra))


def get(run_dir: Path) -> RunTraces | None:
    """The run's loaded traces (None without trace files), parsed once per file version.
    None too for a converted run (scale.use: every finished run): its records are never loaded
    whole here; its readers go through backend/services/gantt_columnar.py and the stored
    analysis. What is parsed and kept here is a running run's (or a lost worker's) JSON lines."""
    global _DROPPED
    files = trace_files(run_dir)
    if not files or _converted(run_dir):
        return None
    try:
        key = _version(run_dir, files)
    except FileNotFoundError:  # a file replaced while we looked: read what is there now
        return get(run_dir) if trace_files(run_dir) else None
    with _LOCK:
        if key in _CACHE:
            _CACHE.move_to_end(key)
            return _CACHE[key]
    with _LOAD_LOCK:  # concurrent requests of one page wait for a single parse
        with _LOCK:
            if key in _CACHE:
                return _CACHE[key]
        expected = RECORD_BYTES * _lines(files)  # (read outside _LOCK: hits go on meanwhile)
        with _LOCK:
            _make_room(key, expected)
        tr = load_run_dir(run_dir)
        rt = RunTraces(tr, nbytes=RECORD_BYTES * sum(len(r) for r in tr.ranks.values()))
        with _LOCK:
            _drop_older(key)
            if rt.nbytes <= LIMIT_BYTES:  # a larger run is served, not kept
                _CACHE[key] = rt
                _evict()
            else:
                _DROPPED = True  # (freed when its request is done)
    return rt


def derived(rt: RunTraces, name: str, fn):
    """`fn(rt.traces)` computed once per trace version."""
    with rt.lock:
        if name not in rt.derived:
            rt.derived[name] = fn(rt.traces)
        return rt.derived[name]


def analysis(run_dir: Path, spec: dict | None) -> dict | None:
    """The stored analysis when the worker wrote one (in the current schema), else the
    analysis of the traces: `"partial": true` while no stored one exists (a running run, or a
    worker lost before analysing); None without traces."""
    stored = None
    path = run_dir / ANALYSIS_FILE
    if path.is_file():
        try:
            stored = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            stored = None  # a torn file: fall back to the traces
    if stored is not None and stored.get("schema") == SCHEMA:
        return stored
    rt = get(run_dir)
    if rt is None:
        return stored  # an older schema without its traces: the best there is
    partial = stored is None
    return derived(rt, "analysis", lambda tr: {**analyze(_copy(tr), spec), "partial": partial})


def _copy(tr: Traces) -> Traces:
    """analyze() appends warnings to its Traces: give it its own list (the Gantt shares tr)."""
    return Traces(ranks=tr.ranks, meta=tr.meta, warnings=list(tr.warnings), summary=tr.summary)


def _converted(run_dir: Path) -> bool:
    from backend.services import gantt_columnar
    return gantt_columnar.covers(run_dir)


def warm(run_dir: Path) -> None:
    """Parse a run's traces and build its Gantt columns before the page asks (a background
    task when a run finishes or its page is opened; for a converted run, the Gantt's
    step list and connection over the Parquet files: gantt_columnar.run_info)."""
    from backend.services import gantt, gantt_columnar  # the dashboard's drawing modules
    if gantt_columnar.covers(run_dir):
        gantt_columnar.run_info(run_dir)
        return
    rt = get(run_dir)
    if rt is not None:
        derived(rt, "gantt", gantt.columns)
