"""A cache bounded in bytes (issue 36): the theory's memos (jobs.theory.advisor's evaluations,
jobs.theory.predict's simulations) are ByteLRUs of CACHE_BYTES each unless
jobs.theory.advisor.configure_caches sets another bound (the service: its setting
PARALAB_ADVISE_CACHE_BYTES). Standard library only."""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict

CACHE_BYTES = 32 << 20


def deep_size(obj) -> int:
    """Bytes of an object and of everything it holds (sys.getsizeof over dicts, lists, tuples,
    sets and their items); shared objects count once per reference, so never less than held."""
    size = sys.getsizeof(obj)
    if isinstance(obj, dict):
        return size + sum(deep_size(k) + deep_size(v) for k, v in obj.items())
    if isinstance(obj, (list, tuple, set, frozenset)):
        return size + sum(deep_size(x) for x in obj)
    return size


class ByteLRU:
    """Entries whose deep_size (key + value) totals at most max_bytes; the least recently used
    go first. A value larger than the whole bound is not kept. Callers must not mutate what
    `get` returns (it is the cached object)."""

    def __init__(self, max_bytes: int):
        assert max_bytes >= 0
        self.max_bytes = max_bytes
        self.nbytes = 0
        self.hits = self.misses = self.evictions = 0
        self._items: OrderedDict = OrderedDict()  # key -> (value, bytes)
        self._lock = threading.Lock()

    def get(self, key, default=None):
        with self._lock:
            got = self._items.get(key)
            if got is None:
                self.misses += 1
                return default
            self._items.move_to_end(key)
            self.hits += 1
            return got[0]

    def put(self, key, value) -> None:
        size = deep_size(key) + deep_size(value)
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self.nbytes -= old[1]
            if size <= self.max_bytes:
                self._items[key] = (value, size)
                self.nbytes += size
            self._evict()

    def resize(self, max_bytes: int) -> None:
        assert max_bytes >= 0
        with self._lock:
            self.max_bytes = max_bytes
            self._evict()

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.nbytes = 0

    def _evict(self) -> None:
        while self.nbytes > self.max_bytes:
            _, (_, size) = self._items.popitem(last=False)
            self.nbytes -= size
            self.evictions += 1

    def __len__(self) -> int:
        return len(self._items)

    def items(self) -> list:
        """(key, value) pairs, least recently used first (a copy)."""
        with self._lock:
            return [(k, v) for k, (v, _) in self._items.items()]

    def stats(self) -> dict:
        return {"entries": len(self._items), "bytes": self.nbytes, "max_bytes": self.max_bytes,
                "hits": self.hits, "misses": self.misses, "evictions": self.evictions}
