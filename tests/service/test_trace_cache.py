"""The API's memory for loaded traces is bounded in bytes, not entries (Settings.
analysis_cache_mb): after many runs the cache holds at most its bound, least recently used
runs go first, a run larger than the bound is served and not kept, a run's older file version
is dropped when a newer one loads, and /api/health reports the process memory and the cache."""

from __future__ import annotations

import pytest

from backend.services import run_traces
from tests.analysis.synth import end, meta, span, write


def a_run(folder, steps: int):
    """Two ranks, `steps` step spans and an end record each: 2 * (steps + 1) records (the
    meta line is the rank's header, not a record)."""
    return write(folder, {r: [meta(r, 2)] + [span(r, s, "step", 10 * s, 10 * s + 5,
                                                  cat="step") for s in range(steps)]
                          + [end(r, 10 * steps + 1)] for r in range(2)})


@pytest.fixture
def bound():
    keep = run_traces.LIMIT_BYTES
    run_traces._CACHE.clear()
    yield
    run_traces._CACHE.clear()
    run_traces.LIMIT_BYTES = keep


def test_many_runs_stay_under_the_byte_bound(tmp_path, bound):
    per = run_traces.RECORD_BYTES
    run_traces.configure(100 * per / (1 << 20))  # room for 100 records
    runs = [a_run(tmp_path / f"r{i}", 19) for i in range(12)]  # 40 records each, by hand
    for i, d in enumerate(runs):
        rt = run_traces.get(d)
        assert rt.nbytes == 40 * per
        assert run_traces.cached_bytes() <= 100 * per
        # the two most recent fit (80 records), a third would not (120)
        assert [k[0] for k in run_traces._CACHE] == [str(x) for x in runs[max(0, i - 1):i + 1]]
    run_traces.get(runs[10])  # used again: now the most recent, runs[11] goes first
    run_traces.get(a_run(tmp_path / "r12", 19))
    assert [k[0] for k in run_traces._CACHE] == [str(runs[10]), str(tmp_path / "r12")]
    big = a_run(tmp_path / "big", 60)  # 122 records: more than the bound
    assert run_traces.get(big) is not None and run_traces.cached_bytes() <= 100 * per
    assert str(big) not in {k[0] for k in run_traces._CACHE}


def test_a_newer_file_version_replaces_the_older(tmp_path, bound):
    run_traces.configure(64)
    d = a_run(tmp_path / "live", 3)
    first = run_traces.get(d)
    a_run(tmp_path / "live", 5)  # the run wrote more: a new version of its files
    second = run_traces.get(d)
    assert second is not first and len(run_traces._CACHE) == 1
    assert second.nbytes == 2 * 6 * run_traces.RECORD_BYTES


def test_health_reports_process_memory_and_the_cache(client, settings):
    m = client.get("/api/health").json()["checks"]["memory"]
    assert m["rss_bytes"] > 10 << 20  # a Python process with FastAPI loaded
    assert m["trace_cache_limit_bytes"] == int(settings.analysis_cache_mb * (1 << 20))
    assert 0 <= m["trace_cache_bytes"] <= m["trace_cache_limit_bytes"]


def test_what_the_cache_lets_go_is_handed_back_once(tmp_path, bound, monkeypatch):
    """Each way a parse leaves the cache (evicted, replaced by a newer version, too large to
    keep) asks the C library for its pages back once (backend/core/memory.release_freed,
    counted here), and nothing else does."""
    from backend.core import memory
    calls = []
    monkeypatch.setattr(memory, "release_freed", lambda: calls.append(1) or True)
    per = run_traces.RECORD_BYTES
    run_traces.configure(100 * per / (1 << 20))
    run_traces.trim_if_dropped()
    calls.clear()
    a, b, c = (a_run(tmp_path / n, 19) for n in "abc")  # 40 records each
    run_traces.get(a)
    run_traces.get(b)
    run_traces.get(a)  # a hit
    assert run_traces.trim_if_dropped() is False and calls == []
    run_traces.get(c)  # 120 records: b, the least recent, is evicted
    assert run_traces.trim_if_dropped() is True and calls == [1]
    assert run_traces.trim_if_dropped() is False and calls == [1]
    a_run(tmp_path / "a", 21)  # a newer version of a's files replaces the older
    run_traces.get(a)
    assert run_traces.trim_if_dropped() is True and calls == [1, 1]
    run_traces.get(a_run(tmp_path / "big", 60))  # served, not kept
    assert run_traces.trim_if_dropped() is True and calls == [1, 1, 1]


def test_the_c_library_calls_answer_on_this_machine():
    """glibc here (Debian): the arena cap is taken and a trim runs (its answer, 0 or 1, says
    only whether pages were free to return, so it is not asserted)."""
    from backend.core import memory
    assert memory._libc() is not None
    assert memory.limit_arenas(8) is True
    memory.release_freed()


def test_room_is_made_before_a_parse_not_after(tmp_path, bound, monkeypatch):
    """The least recently used run leaves before the next one is parsed, so the process never
    holds the bound plus one more parse: what the cache holds while a parse runs, plus that
    parse's charge (40 records, counted by hand from a_run), is within the bound."""
    per = run_traces.RECORD_BYTES
    run_traces.configure(100 * per / (1 << 20))  # room for two 40-record runs, not three
    real, seen = run_traces.load_run_dir, []

    def load(d):
        seen.append(run_traces.cached_bytes())
        return real(d)
    monkeypatch.setattr(run_traces, "load_run_dir", load)
    runs = [a_run(tmp_path / f"r{i}", 19) for i in range(4)]
    for d in runs:
        run_traces.get(d)
    assert seen == [0, 40 * per, 40 * per, 40 * per]  # (0, 1, then 1 of the 2 kept runs)
    assert all(held + 40 * per <= 100 * per for held in seen)
    assert [k[0] for k in run_traces._CACHE] == [str(runs[2]), str(runs[3])]
    seen.clear()
    run_traces.get(a_run(tmp_path / "big", 60))  # too large to keep: evicts nothing for it
    assert seen == [80 * per] and len(run_traces._CACHE) == 2
