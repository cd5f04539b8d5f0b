"""Live-stream fan-out: the worker channel publishes each run's new log lines, status changes
and trace updates here as it records them, and every open stream (`/logs/stream`,
`/live`) waits on its run's topic instead of polling the database.

Why: a stream that polls holds a database connection or a thread for as long as it is open,
so a few dozen open run pages starved the API. Here a waiting stream costs one asyncio Event:
it is woken when its run has news and, when it is caught up, takes the new lines from the
topic's ring buffer without any query. Only a stream that is behind the buffer (a fresh page,
a reconnect after a long pause) runs one short query, in pages.

Several backend processes see each other's events through Redis pub/sub when `REDIS_URL` is
set (the worker's report may reach any of them); without Redis (the embedded default) there is
one backend process and the in-process fan-out is all there is. A lost pub/sub message costs a
stream at most one `timeout` of delay: waits time out and the stream then checks the database.

Log sequence numbers are contiguous per run (the worker numbers its lines from 0), so "the
buffer covers cursor + 1" is an exact test: a stream never skips a line and never gets one
twice."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

CHANNEL = "paralab:runs"
KEEP_LINES = 4000  # per run (up to twice that between trims): seconds of a chatty 4-rank run
KEEP_TOPICS = 512  # runs with recent news; least recently used beyond this are dropped


@dataclass
class _Topic:
    # (seq, rank, line), contiguous seqs: line `seq` sits at index seq - lines[0][0], so a
    # stream's new lines are one slice (hundreds of streams wake on every batch)
    lines: list = field(default_factory=list)
    status: str | None = None
    version: int = 0  # bumped by every event: a waiter compares it with what it has seen
    waiters: set = field(default_factory=set)  # (loop, asyncio.Event)


class Hub:
    """Per-run topics. `publish_*` may be called from any thread (sync routes run in the
    threadpool; the Redis listener has its own thread); subscriptions live on an event loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._topics: OrderedDict[str, _Topic] = OrderedDict()
        self._origin = f"{os.getpid()}-{id(self)}"
        self._redis = None
        self._listener: threading.Thread | None = None
        self._stop = threading.Event()

    # -- publishing (the ingest path) ---------------------------------------------------------
    def publish_lines(self, run_id: str, items: list[tuple[int, int | None, str]]) -> None:
        """New log lines of a run, (seq, rank, line), after they are committed."""
        if items:
            self._publish({"run": run_id, "lines": [list(x) for x in items]})

    def publish_status(self, run_id: str, status: str) -> None:
        self._publish({"run": run_id, "status": status})

    def publish_event(self, run_id: str) -> None:
        """Something else of the run changed (its traces grew): wake its streams."""
        self._publish({"run": run_id})

    def _publish(self, msg: dict) -> None:
        self._apply(msg)
        if self._redis is not None:
            try:
                self._redis.publish(CHANNEL, json.dumps({**msg, "o": self._origin}))
            except Exception as exc:  # noqa: BLE001 - streams fall back to their timeout
                log.warning("stream fan-out through Redis failed: %s", exc)

    def _apply(self, msg: dict) -> None:
        with self._lock:
            t = self._topic(msg["run"])
            for seq, rank, line in msg.get("lines") or ():
                last = t.lines[-1][0] if t.lines else None
                if last is not None and seq <= last:
                    continue  # a retried batch
                if last is not None and seq != last + 1:
                    t.lines.clear()  # a gap (this process started mid-run): restart the buffer
                t.lines.append((seq, rank, line))
            if len(t.lines) > 2 * KEEP_LINES:  # trim in bulk: amortised O(1) per line
                del t.lines[:len(t.lines) - KEEP_LINES]
            if msg.get("status"):
                t.status = msg["status"]
            t.version += 1
            waiters = list(t.waiters)
        for loop, ev in waiters:
            try:
                loop.call_soon_threadsafe(ev.set)
            except RuntimeError:  # that loop is closed: its stream is gone
                pass

    def _topic(self, run_id: str) -> _Topic:
        t = self._topics.get(run_id)
        if t is None:
            t = self._topics[run_id] = _Topic()
            while len(self._topics) > KEEP_TOPICS:
                old, ot = next(iter(self._topics.items()))
                if ot.waiters:  # in use: keep it (move it to the back) and stop evicting
                    self._topics.move_to_end(old)
                    break
                del self._topics[old]
        self._topics.move_to_end(run_id)
        return t

    # -- subscribing (the streams) ------------------------------------------------------------
    def subscribe(self, run_id: str) -> Subscription:
        return Subscription(self, run_id)

    def lines_after(self, run_id: str, cursor: int, rank: int | None = None
                    ) -> tuple[list[tuple[int, int | None, str]], int] | None:
        """The buffered lines after `cursor` (rank-filtered as crud.log_page is) and the
        cursor after them: the last buffered seq, whether its line matched the filter or not
        (a filtered stream moves over the lines it skips, and never has them read again). None
        when the buffer does not hold line `cursor + 1` and the database must be asked."""
        with self._lock:
            t = self._topics.get(run_id)
            if t is None or not t.lines:
                return None
            first, last = t.lines[0][0], t.lines[-1][0]
            if cursor >= last:
                return [], cursor
            if first > cursor + 1:
                return None
            out = t.lines[cursor + 1 - first:]
        return [x for x in out if rank is None or x[1] is None or x[1] == rank], last

    def status(self, run_id: str) -> str | None:
        """The last status published for the run (None: none seen by this process)."""
        with self._lock:
            t = self._topics.get(run_id)
            return t.status if t else None

    def version(self, run_id: str) -> int:
        with self._lock:
            t = self._topics.get(run_id)
            return t.version if t else 0

    def waiting(self, run_id: str | None = None) -> int:
        """How many streams wait (on one run, or on all): for tests and the health page."""
        with self._lock:
            ts = [self._topics.get(run_id)] if run_id else list(self._topics.values())
            return sum(len(t.waiters) for t in ts if t is not None)

    # -- Redis bridge -------------------------------------------------------------------------
    def connect_redis(self, url: str) -> None:
        """Share events with the other backend processes through Redis pub/sub."""
        import redis  # the embedded default runs without it

        self._redis = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
        self._stop.clear()
        self._listener = threading.Thread(target=self._listen, args=(url,), daemon=True,
                                          name="stream-fanout")
        self._listener.start()

    def _listen(self, url: str) -> None:
        import redis

        while not self._stop.is_set():
            try:
                client = redis.Redis.from_url(url, socket_connect_timeout=5)
                ps = client.pubsub(ignore_subscribe_messages=True)
                ps.subscribe(CHANNEL)
                while not self._stop.is_set():
                    m = ps.get_message(timeout=1.0)
                    if m is None:
                        continue
                    msg = json.loads(m["data"])
                    if msg.pop("o", None) != self._origin:
                        self._apply(msg)
                ps.close()
                client.close()
            except Exception as exc:  # noqa: BLE001 - reconnect; streams use their timeout
                log.warning("stream fan-out listener: %s; reconnecting", exc)
                time.sleep(1.0)

    def close(self) -> None:
        self._stop.set()
        if self._listener is not None:
            self._listener.join(timeout=3)
            self._listener = None
        if self._redis is not None:
            self._redis.close()
            self._redis = None


class Subscription:
    """One open stream's registration on its run's topic: `with hub.subscribe(id) as sub:`,
    then `await sub.wait(timeout)` between checks. Subscribe before the first database read:
    whatever is published after that is then in the buffer or wakes the stream."""

    def __init__(self, hub: Hub, run_id: str) -> None:
        self.hub, self.run_id = hub, run_id
        self._ev = asyncio.Event()
        self._key = (asyncio.get_running_loop(), self._ev)
        self.seen = -1

    def __enter__(self) -> Subscription:
        with self.hub._lock:
            t = self.hub._topic(self.run_id)
            t.waiters.add(self._key)
            self.seen = t.version
        return self

    def __exit__(self, *exc) -> None:
        with self.hub._lock:
            t = self.hub._topics.get(self.run_id)
            if t is not None:
                t.waiters.discard(self._key)

    async def wait(self, timeout: float) -> bool:
        """Until the run has news since the last call (True) or `timeout` passed (False)."""
        self._ev.clear()  # before reading the version: a publish in between is then not lost
        v = self.hub.version(self.run_id)
        if v != self.seen:
            self.seen = v
            return True
        try:
            await asyncio.wait_for(self._ev.wait(), timeout)
        except TimeoutError:
            return False
        self.seen = self.hub.version(self.run_id)
        return True


hub = Hub()  # the process's one hub: the routes publish to and subscribe on this
