"""The parent-death signal, set on the children both sides start: the launcher's backend and
worker (backend/launcher.py), the worker's jobs (worker/tasks.py, worker/shim.py)."""

from __future__ import annotations

import ctypes
import signal

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


def pdeathsig_preexec(sig: int = signal.SIGTERM):
    """preexec_fn: the child gets `sig` when its parent dies (even by SIGKILL). SIGTERM, not
    SIGKILL, so torchrun still stops its ranks."""
    prctl = _libc.prctl  # resolved in the parent: the child only makes the call

    def _set():
        prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    return _set
