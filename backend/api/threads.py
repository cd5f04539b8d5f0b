"""Thread capacity of its own for the two kinds of work that must never wait behind each other:
the worker channel, and the streams' (and log downloads') backlog reads.

Why: FastAPI runs every sync route and sync dependency in anyio's one shared pool of 40
threads. When browser streams replaying long logs and page loads held all 40, the worker
channel's log batches and heartbeats queued behind them (issue 36: 3 batches in 30 s instead
of ~60; a false "worker lost" near). Here the worker channel's routes are async, with async
dependencies only, and do their database work in `on_channel` (PARALAB_WORKER_CHANNEL_THREADS
at once, counted apart from the shared 40); a stream's backlog page goes through `replay`
(PARALAB_STREAM_REPLAY_READS at once), so any number of replays holds none of the shared
threads a page load needs, and at most that many threads' worth of CPU.

The limiters are per event loop, as anyio's own default is (a test client starts one loop per
client; a CapacityLimiter belongs to the loop it was first used on)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import anyio
import anyio.to_thread
from anyio.lowlevel import RunVar

T = TypeVar("T")

_limiters: RunVar[dict[str, anyio.CapacityLimiter]] = RunVar("paralab_limiters")


def limiter(name: str, total: int) -> anyio.CapacityLimiter:
    """This event loop's limiter `name` (created with `total` tokens on first use)."""
    try:
        mine = _limiters.get()
    except LookupError:
        mine = {}
        _limiters.set(mine)
    key = f"{name}:{total}"
    if key not in mine:
        mine[key] = anyio.CapacityLimiter(total)
    return mine[key]


async def on_channel(settings, fn: Callable[..., T], *args) -> T:
    """`fn(*args)` in a thread of the worker channel's own capacity."""
    return await anyio.to_thread.run_sync(
        fn, *args, limiter=limiter("worker_channel", settings.worker_channel_threads))


async def replay(settings, fn: Callable[..., T], *args) -> T:
    """`fn(*args)`, one page of a stream's or a download's backlog, in a thread of the replay
    reads' capacity (the other readers wait their turn, holding no thread)."""
    return await anyio.to_thread.run_sync(
        fn, *args, limiter=limiter("replay", settings.stream_replay_reads))
