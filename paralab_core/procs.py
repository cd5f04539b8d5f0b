"""The children both sides start: the parent-death signal set on them (the launcher's backend
and worker, backend/launcher.py; the worker's jobs, worker/tasks.py and worker/shim.py), and a
wait for a child's exit that its exit wakes."""

from __future__ import annotations

import ctypes
import os
import select
import signal
import subprocess

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


def pdeathsig_preexec(sig: int = signal.SIGTERM):
    """preexec_fn: the child gets `sig` when its parent dies (even by SIGKILL). SIGTERM, not
    SIGKILL, so torchrun still stops its ranks."""
    prctl = _libc.prctl  # resolved in the parent: the child only makes the call

    def _set():
        prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    return _set


def wait_exit(proc: subprocess.Popen, timeout: float) -> bool:
    """Until `proc` has exited (True; reaped) or `timeout` s have passed (False). Woken by the
    exit itself through a pidfd: the supervising loops of the worker and the shim used to
    sleep 0.1 s between polls, which added up to that (twice over) to every run's end.
    Signals still reach a caller's handlers (select resumes after them, PEP 475)."""
    if proc.poll() is not None:
        return True
    try:
        fd = os.pidfd_open(proc.pid)
    except OSError:  # a kernel without pidfds: Popen's own wait (short sleeps)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return True
    try:
        select.select([fd], [], [], timeout)
    finally:
        os.close(fd)
    return proc.poll() is not None
