"""What the API process does about its own heap (glibc's malloc): a parsed run's traces are
hundreds of MiB of small Python objects, freed when the trace cache drops them, but glibc keeps
freed pages in its arenas (one per thread that allocated, up to 8 x cores), so the process's
resident memory kept the high-water mark of every thread that ever parsed a run
(docs/benchmarks.md, API resident memory). Two calls, no-ops where the C library is not glibc:
fewer arenas at start-up, and the freed pages handed back after an eviction."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

M_ARENA_MAX = -8  # glibc's mallopt parameter number (malloc.h)
ARENAS = 2  # the event loop's thread and the request threads: they share two


@functools.cache
def _libc():
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.malloc_trim, libc.mallopt  # glibc's, not musl's or macOS's  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


def limit_arenas(n: int = ARENAS) -> bool:
    """Cap glibc's malloc arenas (MALLOC_ARENA_MAX, set from inside): call before the request
    threads start. True when the C library took it."""
    libc = _libc()
    return bool(libc and libc.mallopt(M_ARENA_MAX, n))


def release_freed() -> bool:
    """Return the heap's free pages to the system (malloc_trim(0): every arena, not only the
    top of the main heap). Costs a walk of the free lists: call it after a large free (the
    trace cache's eviction), not per request. True when memory was released."""
    libc = _libc()
    return bool(libc and libc.malloc_trim(0))
