"""A running run is served from a scratch conversion of its lines (backend/services/
run_traces.py), a cache bounded in bytes, not entries (Settings.analysis_cache_mb): after many
runs it holds at most its bound, least recently used runs go first, a run larger than the bound
is served and not kept, a run's older file version is dropped when a newer one converts, a
folder let go is deleted a grace period later, the run's own folder is never touched, and
/api/health reports the process memory and the cache."""

from __future__ import annotations

import pytest

from backend.services import run_traces
from devtools.oracle import analyze_run_dir
from tests.analysis.synth import end, meta, span, write


def a_run(folder, steps: int, ranks: int = 2):
    """`ranks` ranks, `steps` step spans and an end record each (runs of one shape are equal
    byte for byte, so are their conversions)."""
    return write(folder, {r: [meta(r, ranks)] + [span(r, s, "step", 10 * s, 10 * s + 5,
                                                      cat="step") for s in range(steps)]
                          + [end(r, 10 * steps + 1)] for r in range(ranks)})


@pytest.fixture
def bound(tmp_path):
    keep = run_traces.LIMIT_BYTES
    run_traces._CACHE.clear()
    yield
    run_traces._CACHE.clear()
    run_traces.LIMIT_BYTES = keep


def per_run(tmp_path) -> int:
    """What one 19-step run's conversion is charged (its files' bytes, measured once)."""
    run_traces.configure(64)
    n = run_traces.get(a_run(tmp_path / "probe", 19)).nbytes
    run_traces._CACHE.clear()
    assert n > 0
    return n


def keys(base) -> list[str]:
    return [k[0] for k in run_traces._CACHE]


def test_many_runs_stay_under_the_byte_bound(tmp_path, bound):
    per = per_run(tmp_path)
    run_traces.configure(2.5 * per / (1 << 20))  # room for two runs, not three
    runs = [a_run(tmp_path / f"r{i}", 19) for i in range(12)]
    for i, d in enumerate(runs):
        s = run_traces.get(d)
        assert s.nbytes == per and s.dir.parent != d.parent
        assert run_traces.cached_bytes() <= 2.5 * per
        assert keys(tmp_path) == [str(x) for x in runs[max(0, i - 1):i + 1]]
    run_traces.get(runs[10])  # used again: now the most recent, runs[11] goes first
    run_traces.get(a_run(tmp_path / "r12", 19))
    assert keys(tmp_path) == [str(runs[10]), str(tmp_path / "r12")]
    big = a_run(tmp_path / "big", 19, ranks=8)  # its conversion is more than the bound
    got = run_traces.get(big)
    assert got.nbytes > 2.5 * per and (got.dir / "trace-rank7.parquet").is_file()
    assert run_traces.cached_bytes() <= 2.5 * per and str(big) not in keys(tmp_path)


def test_a_newer_file_version_replaces_the_older(tmp_path, bound):
    run_traces.configure(64)
    d = a_run(tmp_path / "live", 3)
    first = run_traces.get(d)
    a_run(tmp_path / "live", 5)  # the run wrote more: a new version of its files
    second = run_traces.get(d)
    assert second is not first and second.dir != first.dir and len(run_traces._CACHE) == 1
    assert first.dir in [p for _, p in run_traces._DOOMED]


def test_the_partial_analysis_is_the_oracles_and_the_run_folder_is_untouched(tmp_path, bound):
    """The scratch copy's analysis (the one engine) equals the Python tables over the loaded
    lines; the run's folder keeps its files, their bytes and times (a flusher's blocks file
    beside the lines included: the copy reads the lines only)."""
    run_traces.configure(64)
    d = a_run(tmp_path / "run", 7)
    (d / "trace-rank0.blocks").write_bytes(b"not read")
    before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in d.iterdir()}
    got, where = run_traces.analysis(d, None)
    assert got["partial"] is True and got["engine"] == "columnar" and where != d
    want = analyze_run_dir(d)
    assert got["tables"] == want["tables"] and got["headline"] == want["headline"]
    assert {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in d.iterdir()} == before
    assert run_traces.analysis(d, None)[0] is got  # kept per version
    assert run_traces.cached_bytes() > run_traces._size(where)  # the document is charged


def test_health_reports_process_memory_and_the_cache(client, settings):
    m = client.get("/api/health").json()["checks"]["memory"]
    assert m["rss_bytes"] > 10 << 20  # a Python process with FastAPI loaded
    assert m["trace_cache_limit_bytes"] == int(settings.analysis_cache_mb * (1 << 20))
    assert 0 <= m["trace_cache_bytes"] <= m["trace_cache_limit_bytes"]


def test_let_go_folders_are_deleted_after_the_grace_and_memory_handed_back_once(
        tmp_path, bound, monkeypatch):
    """Each way a copy leaves the cache (evicted, replaced by a newer version, too large to
    keep) asks the C library for its pages back once (backend/core/memory.release_freed,
    counted here), and nothing else does; its folder is deleted GRACE_S later (the clock
    injected), not before: a request still reading it finishes first."""
    from backend.core import memory
    calls = []
    monkeypatch.setattr(memory, "release_freed", lambda: calls.append(1) or True)
    per = per_run(tmp_path)
    run_traces.configure(2.5 * per / (1 << 20))
    run_traces.trim_if_dropped()
    calls.clear()
    a, b, c = (a_run(tmp_path / n, 19) for n in "abc")
    run_traces.get(a)
    sb = run_traces.get(b)
    run_traces.get(a)  # a hit
    assert run_traces.trim_if_dropped() is False and calls == []
    run_traces.get(c)  # b, the least recent, is evicted
    assert run_traces.trim_if_dropped() is True and calls == [1]
    assert run_traces.trim_if_dropped() is False and calls == [1]
    assert sb.dir.is_dir()  # within the grace
    t = run_traces.time.monotonic()
    run_traces.trim_if_dropped(now=t + run_traces.GRACE_S + 1)
    assert not sb.dir.exists() and calls == [1]
    a_run(tmp_path / "a", 21)  # a newer version of a's files replaces the older
    run_traces.get(a)
    assert run_traces.trim_if_dropped() is True and calls == [1, 1]
    run_traces.get(a_run(tmp_path / "big", 19, ranks=8))  # served, not kept
    assert run_traces.trim_if_dropped() is True and calls == [1, 1, 1]


def test_without_heap_trim_let_go_folders_are_still_deleted(tmp_path, bound, monkeypatch):
    """Settings.heap_trim off keeps the pages (no release_freed call) but not the disk: a
    replaced version's scratch folder goes after the grace all the same."""
    from backend.core import memory
    calls = []
    monkeypatch.setattr(memory, "release_freed", lambda: calls.append(1) or True)
    run_traces.configure(64)
    d = a_run(tmp_path / "live", 3)
    first = run_traces.get(d)
    a_run(tmp_path / "live", 5)
    run_traces.get(d)
    t = run_traces.time.monotonic() + run_traces.GRACE_S + 1
    assert run_traces.trim_if_dropped(now=t, release=False) is False
    assert not first.dir.exists() and calls == []


def test_the_c_library_calls_answer_on_this_machine():
    """glibc here (Debian): the arena cap is taken and a trim runs (its answer, 0 or 1, says
    only whether pages were free to return, so it is not asserted)."""
    from backend.core import memory
    assert memory._libc() is not None
    assert memory.limit_arenas(8) is True
    memory.release_freed()


def test_room_is_made_before_a_conversion_not_after(tmp_path, bound, monkeypatch):
    """The least recently used run leaves before the next one is converted, so the process
    never holds the bound plus one more conversion: what the cache holds while a conversion
    runs, plus that conversion's expected charge, is within the bound (the estimate set here
    to the measured charge)."""
    per = per_run(tmp_path)
    lines = sum(p.stat().st_size for p in (tmp_path / "probe").glob("trace-rank*.jsonl"))
    monkeypatch.setattr(run_traces, "PARQUET_PER_LINE_BYTE", per / lines)
    run_traces.configure(2.5 * per / (1 << 20))  # room for two runs, not three
    real, seen = run_traces._convert, []

    def convert(*a):
        seen.append(run_traces.cached_bytes())
        return real(*a)
    monkeypatch.setattr(run_traces, "_convert", convert)
    runs = [a_run(tmp_path / f"r{i}", 19) for i in range(4)]
    for d in runs:
        run_traces.get(d)
    assert seen == [0, per, per, per]  # (0, 1, then 1 of the 2 kept runs)
    assert all(held + per <= 2.5 * per for held in seen)
    assert keys(tmp_path) == [str(runs[2]), str(runs[3])]
    seen.clear()
    run_traces.get(a_run(tmp_path / "big", 19, ranks=8))  # too large to keep: evicts nothing for it
    assert seen == [2 * per] and len(run_traces._CACHE) == 2
