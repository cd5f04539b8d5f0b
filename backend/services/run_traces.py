"""A run's analysis and columnar traces as the backend serves them, whatever its state: one
engine (jobs.analysis.analyze_folder) for every answer.

A finished run is served from what the worker stored: `analysis.json` and the run's Parquet
files (its Gantt, tables and exports read them: gantt_columnar.py, engine.table_rows). Until
then (a running run, or one whose worker was lost before converting) the backend converts
the shipped JSON lines into a scratch folder of its own, once per file version (jobs.
analysis.convert, from the lines only: nothing in the run's folder is written or removed),
and the same engine analyses that folder: a running run's partial figures, Gantt, tables and
exports are the finished run's code over a copy. No record is parsed into Python here.

The scratch folders are a cache bounded in bytes (Settings.analysis_cache_mb): each entry is
charged its Parquet files on disk plus its analysis document (what this process holds of it),
least recently used first out; a conversion larger than the bound is served and not kept. A
folder let go is deleted a grace period later (a request still reading it finishes first).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from jobs.analysis import ANALYSIS_FILE, SCHEMA, analyze_folder
from jobs.analysis.storage import columnar
from jobs.analysis.storage.convert import convert_rank
from jobs.analysis.storage.jsonl import _RANK_RE

_CACHE: OrderedDict[tuple, Scratch] = OrderedDict()
_LOCK = threading.Lock()
_LOAD_LOCK = threading.Lock()  # one conversion at a time (a page's requests share it)
LIMIT_BYTES = 256 << 20  # Settings.analysis_cache_mb, set by configure() at app start
# Parquet bytes per JSON-lines byte a conversion is expected to take before it is made (the
# room made for it): measured 0.08-0.12 on the presets' traces, the larger charged twice
PARQUET_PER_LINE_BYTE = 0.25
GRACE_S = 60.0  # a folder let go is deleted after this (requests reading it end first)
_ROOT: Path | None = None
_DOOMED: list[tuple[float, Path]] = []  # (when let go, folder)
_DROPPED = False  # something was let go since the last trim


def configure(limit_mb: float, root: Path | None = None) -> None:
    """The cache's byte bound (Settings.analysis_cache_mb) and where its folders go (a
    folder of this process under `root`; default the system's temporary directory). Drops
    what no longer fits."""
    global LIMIT_BYTES, _ROOT
    LIMIT_BYTES = int(limit_mb * (1 << 20))
    if root is not None:
        _ROOT = _own_folder(Path(root))
    with _LOCK:
        _evict()


def _own_folder(root: Path) -> Path:
    """`root/<pid>`, after removing the folders of processes no longer alive (a killed API
    leaves its scratch behind); removed at exit."""
    root.mkdir(parents=True, exist_ok=True)
    for d in root.iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid() and not _alive(int(d.name)):
            shutil.rmtree(d, ignore_errors=True)
    mine = root / str(os.getpid())
    mine.mkdir(exist_ok=True)
    atexit.register(shutil.rmtree, mine, True)
    return mine


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _root() -> Path:
    global _ROOT
    if _ROOT is None:
        _ROOT = Path(tempfile.mkdtemp(prefix="paralab-scratch-"))
        atexit.register(shutil.rmtree, _ROOT, True)
    _ROOT.mkdir(parents=True, exist_ok=True)  # (removed under us: a test's data directory)
    return _ROOT


@dataclass
class Scratch:
    """One file version of a run's traces, converted: `dir` holds `trace-rank{R}.parquet`
    (and the run's summary.json), what jobs.analysis reads of a converted run."""
    dir: Path
    nbytes: int  # charged against LIMIT_BYTES: the files, then the analysis too
    analysis: dict | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


def cached_bytes() -> int:
    """What the cache holds now, as charged (health reports it)."""
    with _LOCK:
        return sum(s.nbytes for s in _CACHE.values())


def _let_go(s: Scratch) -> None:
    """(caller holds _LOCK)"""
    global _DROPPED
    _DOOMED.append((time.monotonic(), s.dir))
    _DROPPED = True


def _evict(expected: int = 0) -> None:
    """Least recently used first, until the rest (and `expected` more bytes) fits (caller
    holds _LOCK)."""
    total = sum(s.nbytes for s in _CACHE.values())
    while _CACHE and total + expected > LIMIT_BYTES:
        _, old = _CACHE.popitem(last=False)
        total -= old.nbytes
        _let_go(old)


def _drop_older(key: tuple) -> None:
    """Drop the cached older versions of `key`'s run: never asked again (caller holds _LOCK)."""
    for old in [k for k in _CACHE if k[0] == key[0] and k != key]:
        _let_go(_CACHE.pop(old))


def trim_if_dropped(now: float | None = None, release: bool = True) -> bool:
    """Delete the scratch folders let go more than GRACE_S ago, and (`release`) hand the
    pages of what the cache let go back to the system (backend.core.memory: glibc keeps
    freed pages otherwise, and the API's RSS kept every high-water mark). Called every few
    seconds by the app (backend.main). True when it trimmed."""
    global _DROPPED
    now = time.monotonic() if now is None else now
    with _LOCK:
        due = [d for t, d in _DOOMED if now - t >= GRACE_S]
        _DOOMED[:] = [(t, d) for t, d in _DOOMED if now - t < GRACE_S]
        dropped, _DROPPED = _DROPPED, False
    for d in due:
        shutil.rmtree(d, ignore_errors=True)
    if not (dropped and release):
        return False
    from backend.core.memory import release_freed
    release_freed()
    return True


def trace_files(run_dir: Path) -> list[Path]:
    return sorted(run_dir.glob("trace-rank*.jsonl"))


def _version(run_dir: Path, files: list[Path]) -> tuple:
    extra = [p for p in (run_dir / "summary.json",) if p.is_file()]
    return (str(run_dir), tuple((p.name, p.stat().st_mtime_ns, p.stat().st_size)
                                for p in files + extra))


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())


def get(run_dir: Path) -> Scratch | None:
    """The scratch conversion of a run not converted yet, made once per file version; None
    without trace files, and for a converted run (every finished run: read in place)."""
    if converted(run_dir):
        return None
    return _scratch(run_dir)


def _scratch(run_dir: Path) -> Scratch | None:
    """get() of a run known not to be converted."""
    files = trace_files(run_dir)
    if not files:
        return None
    try:
        key = _version(run_dir, files)
    except FileNotFoundError:  # a file replaced while we looked: read what is there now
        return _scratch(run_dir)
    with _LOCK:
        if key in _CACHE:
            _CACHE.move_to_end(key)
            return _CACHE[key]
    with _LOAD_LOCK:  # concurrent requests of one page wait for a single conversion
        with _LOCK:
            if key in _CACHE:
                return _CACHE[key]
        expected = int(PARQUET_PER_LINE_BYTE * sum(size for _, _, size in key[1]))
        with _LOCK:  # room before the conversion, so the bound plus one is never held
            _drop_older(key)
            if expected <= LIMIT_BYTES:
                _evict(expected)
        s = Scratch(_convert(run_dir, files, key), 0)
        s.nbytes = _size(s.dir)
        with _LOCK:
            _drop_older(key)
            if s.nbytes <= LIMIT_BYTES:  # a larger run is served, not kept
                _CACHE[key] = s
                _evict()
            else:
                _let_go(s)
    return s


def _convert(run_dir: Path, files: list[Path], key: tuple) -> Path:
    """The run's lines as they are now into a new scratch folder (written under a temporary
    name, then renamed: a reader never sees half of it)."""
    name = hashlib.sha1(repr(key).encode()).hexdigest()[:20]
    dest = _root() / name
    part = Path(tempfile.mkdtemp(prefix=name + ".", dir=_root()))
    columnar.use_system_pool()
    try:
        for path in files:
            m = _RANK_RE.search(path.name)
            if m:  # (a rank file that cannot be read is left out: the warnings say)
                convert_rank(path, int(m.group(1)), part / columnar.parquet_path(path).name,
                             blocks=False)
        summary = run_dir / "summary.json"
        if summary.is_file():
            shutil.copyfile(summary, part / summary.name)
    except BaseException:  # (a full disk, say): no half-made copy is left behind
        shutil.rmtree(part, ignore_errors=True)
        raise
    if dest.exists():  # (an earlier process' or a let-go copy of this very version)
        shutil.rmtree(dest, ignore_errors=True)
    os.replace(part, dest)
    return dest


def converted(run_dir: Path) -> bool:
    """The worker stored the run's Parquet files (every finished run)."""
    try:
        return columnar.has_columnar(run_dir)
    except OSError:
        return False


def source(run_dir: Path) -> Path | None:
    """The folder the run's columnar traces are read from: its own when converted, else its
    scratch conversion; None without traces."""
    if converted(run_dir):
        return run_dir
    s = _scratch(run_dir)
    return s.dir if s is not None else None


def analysis(run_dir: Path, spec: dict | None) -> tuple[dict | None, Path | None]:
    """(the analysis, the folder its table files are in). The stored analysis when the
    worker wrote one (in the current schema), else the one engine's analysis of the scratch
    conversion: `"partial": true` while no stored one exists (a running run, or a worker
    lost before analysing); (None, None) without traces."""
    stored = None
    path = run_dir / ANALYSIS_FILE
    if path.is_file():
        try:
            stored = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            stored = None  # a torn file: fall back to the traces
    if stored is not None and stored.get("schema") == SCHEMA:
        return stored, run_dir
    s = get(run_dir)
    if s is None:
        return stored, run_dir  # an older schema without its traces: the best there is
    with s.lock:
        if s.analysis is None:
            s.analysis = {**analyze_folder(s.dir, spec), "partial": stored is None}
            grew = len(json.dumps(s.analysis, default=str)) + _size(s.dir) - s.nbytes
            with _LOCK:
                s.nbytes += grew
                if any(v is s for v in _CACHE.values()):
                    _evict()
        return s.analysis, s.dir


def warm(run_dir: Path) -> None:
    """Convert a running run's traces and build its Gantt's step list before the page asks
    (a background task when a run finishes or its page is opened; for a converted run, the
    step list and connection over its own Parquet files)."""
    from backend.services import gantt_columnar  # the dashboard's drawing module
    src = source(run_dir)
    if src is not None:
        gantt_columnar.run_info(src)
