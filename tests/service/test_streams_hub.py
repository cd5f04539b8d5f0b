"""The live-stream fan-out (backend/streams.py): buffered lines are served exactly once and in
order, a stream behind the buffer is told to ask the database, waiters wake on news from this
process and, through real Redis pub/sub, from another one."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest

from backend import streams
from backend.streams import Hub

REDIS = os.environ.get("PARALAB_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def lines(a: int, b: int, rank=None):
    return [(s, rank, f"line {s}") for s in range(a, b)]


def seqs(got):
    """(the seqs of the lines, the cursor after them) of Hub.lines_after's answer."""
    return [x[0] for x in got[0]], got[1]


def test_buffer_covers_exactly_the_lines_after_the_cursor():
    h = Hub()
    assert h.lines_after("r", -1) is None  # nothing buffered: ask the database
    h.publish_lines("r", lines(0, 5))
    assert seqs(h.lines_after("r", -1)) == ([0, 1, 2, 3, 4], 4)
    assert seqs(h.lines_after("r", 2)) == ([3, 4], 4)
    assert h.lines_after("r", 4) == ([], 4)
    h.publish_lines("r", lines(3, 7))  # a retried, overlapping batch adds only 5 and 6
    assert seqs(h.lines_after("r", 2)) == ([3, 4, 5, 6], 6)


def test_a_gap_restarts_the_buffer_and_older_cursors_go_to_the_database():
    h = Hub()
    h.publish_lines("r", lines(0, 3))
    h.publish_lines("r", lines(10, 12))  # this process missed 3..9
    assert h.lines_after("r", 2) is None
    assert seqs(h.lines_after("r", 9)) == ([10, 11], 11)


def test_eviction_beyond_the_ring_sends_slow_readers_to_the_database(monkeypatch):
    monkeypatch.setattr(streams, "KEEP_LINES", 10)
    h = Hub()
    h.publish_lines("r", lines(0, 25))
    assert h.lines_after("r", 5) is None
    assert seqs(h.lines_after("r", 14)) == (list(range(15, 25)), 24)


def test_rank_filter_keeps_unranked_lines():
    h = Hub()
    h.publish_lines("r", [(0, 0, "a"), (1, 1, "b"), (2, None, "c"), (3, 1, "d")])
    assert [x[2] for x in h.lines_after("r", -1, rank=1)[0]] == ["b", "c", "d"]


def test_rank_filter_moves_the_cursor_over_the_lines_it_skips():
    """Issue 36 item 4: a filtered stream's cursor is the last line the buffer covered, not
    the last that matched, so lines of other ranks are never looked at twice."""
    h = Hub()
    h.publish_lines("r", [(0, 0, "a"), (1, 0, "b"), (2, 0, "c")])
    assert h.lines_after("r", -1, rank=7) == ([], 2)
    h.publish_lines("r", [(3, 0, "d"), (4, 7, "e")])
    assert seqs(h.lines_after("r", 2, rank=7)) == ([4], 4)


def test_waiters_wake_on_news_from_another_thread_and_time_out_without():
    h = Hub()

    async def main():
        with h.subscribe("r") as sub:
            assert h.waiting("r") == 1
            assert await sub.wait(0.05) is False  # no news
            threading.Timer(0.05, h.publish_status, args=("r", "running")).start()
            assert await sub.wait(30) is True
            h.publish_event("r")  # news before the wait starts is not lost
            assert await sub.wait(0.01) is True
        assert h.waiting("r") == 0

    asyncio.run(main())


def test_topics_in_use_are_never_evicted(monkeypatch):
    monkeypatch.setattr(streams, "KEEP_TOPICS", 3)
    h = Hub()

    async def main():
        with h.subscribe("watched") as sub:
            for i in range(10):
                h.publish_event(f"other{i}")
            h.publish_status("watched", "running")
            assert await sub.wait(1) is True
            assert h.waiting("watched") == 1

    asyncio.run(main())


def test_two_processes_share_events_through_redis():
    """Two hubs stand for two backend processes: what one publishes wakes and feeds the
    other's streams through real Redis pub/sub."""
    redis = pytest.importorskip("redis")
    try:
        redis.Redis.from_url(REDIS, socket_connect_timeout=2).ping()
    except redis.RedisError as exc:
        pytest.fail(f"Redis at {REDIS} is required (scripts/provision.sh starts it): {exc}")
    a, b = Hub(), Hub()
    a.connect_redis(REDIS)
    b.connect_redis(REDIS)
    run = f"hub-{os.getpid()}"
    try:
        async def main():
            with b.subscribe(run) as sub:
                await asyncio.sleep(0.3)  # let b's listener subscribe
                for _ in range(100):  # the listener may need a moment to attach
                    a.publish_lines(run, lines(0, 3))
                    if await sub.wait(0.2):
                        break
                assert seqs(b.lines_after(run, -1)) == ([0, 1, 2], 2)
                a.publish_status(run, "succeeded")
                while b._topics[run].status != "succeeded":
                    assert await sub.wait(10), "no event through Redis"
        asyncio.run(main())
    finally:
        a.close()
        b.close()
