"""Work outside the calling process (issue 36): a small pool of child processes, each running
one call at a time under an address-space bound (RLIMIT_AS) and killed past a wall-clock bound.
The API runs the advisor's searches here: outside its event loop and its GIL, so a search
costs the API a thread waiting on a pipe, and at most `size` searches run at once.

Pool(size, timeout_s, memory_bytes, setup=None)
    call(fn, *args, **kwargs) -> fn(*args, **kwargs) run in a child; raises
        Busy          every child is busy (retry_after_s: when the oldest call reaches its
                      wall-clock bound, so a child is free by then at the latest)
        TimedOut      the call ran past timeout_s: its child was killed (SIGKILL)
        OutOfMemory   the call needed more than memory_bytes of address space: its child
                      exited
        Died          the child ended otherwise (exit code or signal)
        SpecError     what fn raised (jobs.spec's input error; the child lives on)
        RuntimeError  any other exception fn raised (type and message; the child lives on)
    close()           ends every child
fn must be importable by name (a module-level function), and so must `setup`: (function,
args) a child runs once at start (the service sets the memos' byte bound there).

A child is a fresh interpreter (`python -m jobs.theory.pool`, fork + exec by subprocess),
never a fork of the calling process: the API has threads (a fork after threads can deadlock
in the child) and modules the work does not need, and multiprocessing's spawn and forkserver
children re-import the parent's __main__ (under `paralab serve`, backend.cli). It imports the
standard library and jobs.theory (no torch: ~0.15 s to start), then answers calls over a
socket pair until that closes or IDLE_S pass without work, which hands back what its memos
held. Standard library only.
"""

from __future__ import annotations

import itertools
import os
import resource
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path

from jobs.spec import SpecError

IDLE_S = 300.0
_MEMORY_EXIT = 86  # a child's exit code when its address space ran out


class PoolError(Exception):
    pass


class Busy(PoolError):
    def __init__(self, retry_after_s: float):
        super().__init__(f"every worker process is busy; retry in {retry_after_s:.0f} s")
        self.retry_after_s = retry_after_s


class TimedOut(PoolError):
    pass


class OutOfMemory(PoolError):
    pass


class Died(PoolError):
    pass


def _serve(conn) -> None:
    """A child: set its address-space bound, run `setup`, then answer calls until the pipe
    closes or IDLE_S pass without one."""
    try:
        memory_bytes, setup = conn.recv()
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        if setup is not None:
            setup[0](*setup[1])
        while conn.poll(IDLE_S):
            fn, args, kwargs = conn.recv()
            try:
                out = ("ok", fn(*args, **kwargs))
            except SpecError as exc:
                out = ("spec", exc.errors)
            except MemoryError:
                raise
            except Exception as exc:  # a defect in fn: reported, not hidden
                out = ("raised", f"{type(exc).__name__}: {exc}")
            conn.send(out)
    except MemoryError:
        try:
            conn.send(("memory", None))
        finally:
            os._exit(_MEMORY_EXIT)
    except (EOFError, OSError):  # the caller went away
        return


@dataclass
class _Child:
    proc: subprocess.Popen
    conn: Connection
    idle_since: float = field(default_factory=time.monotonic)

    def alive(self) -> bool:
        return self.proc.poll() is None


# where `python -m jobs.theory.pool` finds jobs (the calling process may have it on sys.path
# only, as a test run from the checkout does)
_ROOT = str(Path(__file__).resolve().parents[2])


class Pool:
    def __init__(self, size: int, timeout_s: float, memory_bytes: int, setup=None):
        assert size >= 1 and timeout_s > 0 and memory_bytes > 0
        self.size, self.timeout_s, self.memory_bytes = size, timeout_s, memory_bytes
        self.setup = setup
        self.pid = os.getpid()  # a pool serves the process that made it, not a fork of it
        self.last_pid: int | None = None  # the child of the latest call (tests, bench)
        self._lock = threading.Lock()
        self._idle: list[_Child] = []
        self._busy: dict[int, float] = {}  # call id -> when it started (monotonic)
        self._ids = itertools.count()
        self._closed = False

    def _start(self) -> _Child:
        mine, theirs = socket.socketpair()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            filter(None, [_ROOT, os.environ.get("PYTHONPATH")]))}
        try:
            proc = subprocess.Popen([sys.executable, "-m", __name__, str(theirs.fileno())],
                                    pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                                    env=env)
        finally:
            theirs.close()
        conn = Connection(mine.detach())
        conn.send((self.memory_bytes, self.setup))
        return _Child(proc, conn)

    @staticmethod
    def _end(child: _Child) -> None:
        child.conn.close()
        if child.alive():
            child.proc.kill()  # SIGKILL to the child this pool started, by its pid
        child.proc.wait()

    def _take(self) -> tuple[int, _Child | None]:
        now = time.monotonic()
        with self._lock:
            if self._closed:
                raise Died("the pool is closed")
            if len(self._busy) >= self.size:
                oldest = min(self._busy.values())
                raise Busy(max(1.0, oldest + self.timeout_s - now))
            call = next(self._ids)
            self._busy[call] = now
            stale, child = [], None
            while self._idle:
                c = self._idle.pop()
                # a child near its own idle exit is not handed work (it might leave mid-call)
                if now - c.idle_since < IDLE_S / 2 and c.alive():
                    child = c
                    break
                stale.append(c)
        for c in stale:
            self._end(c)
        return call, child

    def call(self, fn, *args, **kwargs):
        call, child = self._take()
        keep = False
        try:
            if child is None:
                child = self._start()
            self.last_pid = child.proc.pid
            try:
                child.conn.send((fn, args, kwargs))
                if not child.conn.poll(self.timeout_s):
                    raise TimedOut(f"ran past the wall-clock bound of {self.timeout_s:g} s")
                kind, value = child.conn.recv()
            except (EOFError, OSError):  # the child is gone (its exit code says why)
                kind, value = "died", None
            if kind == "died":
                try:
                    child.proc.wait(5)
                except subprocess.TimeoutExpired:
                    pass
                if child.proc.returncode == _MEMORY_EXIT:
                    kind = "memory"
            if kind == "memory":
                raise OutOfMemory(f"needed more than the memory bound of "
                                  f"{self.memory_bytes} bytes")
            if kind == "died":
                raise Died(f"the worker process ended (exit code {child.proc.returncode})")
            keep = True
            if kind == "spec":
                raise SpecError(value)
            if kind == "raised":
                raise RuntimeError(value)
            return value
        finally:
            if child is not None and not keep:
                self._end(child)  # killed, or gone: its place is refilled on demand
            with self._lock:
                self._busy.pop(call, None)
                if keep and not self._closed:
                    child.idle_since = time.monotonic()
                    self._idle.append(child)
            if keep and self._closed:
                self._end(child)

    def busy(self) -> int:
        """How many calls are running now."""
        with self._lock:
            return len(self._busy)

    def children(self) -> list[int]:
        """The pids of the live children (idle ones; busy ones are in their callers' hands)."""
        with self._lock:
            return [c.proc.pid for c in self._idle if c.alive()]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for c in idle:
            self._end(c)


if __name__ == "__main__":  # a child: its end of the socket pair is argv[1]
    _serve(Connection(int(sys.argv[1])))
