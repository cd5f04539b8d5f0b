"""Finding and stopping every process of a job.

torchrun puts each rank in its own process group, so killing torchrun's group misses them,
and SIGKILL to torchrun orphans them. SIGTERM to torchrun stops all ranks quickly; whatever
is left is found by the key (PROC_KEY: run ID, and node) every job process carries in its
environment.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path


def pids_with_env(key: str, value: str, *, having: str | None = None,
                  named: str | None = None) -> list[int]:
    """Processes whose environment holds key=value (and, with `having`, also sets that
    variable to anything, or, with `named`, has that process name: /proc/PID/comm)."""
    needle = f"{key}={value}".encode()
    also = f"{having}=".encode() if having else None
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes()
        except (OSError, PermissionError):
            continue
        items = env.split(b"\0")
        if needle in items and (also is None or any(e.startswith(also) for e in items)
                                or (named is not None and _comm(entry) == named)):
            found.append(int(entry.name))
    return found


def _comm(proc: Path) -> str | None:
    try:
        return (proc / "comm").read_text().strip()
    except OSError:
        return None


# What finds the processes of one run on this host: the run ID, and for one node of a multi-host
# run also the node (the nodes of a run on one machine, as in the loopback tests, are several
# "hosts": stopping one must not touch the others).
PROC_KEY = "PARALAB_PROCS"


def proc_key(run_id: str, node: int | None = None) -> str:
    return run_id if node is None else f"{run_id}.node{node}"


def kill_run_processes(key: str, sig: int = signal.SIGKILL) -> list[int]:
    """Every process of the run (or node) `key` (proc_key) but this one."""
    me = os.getpid()
    pids = [p for p in pids_with_env(PROC_KEY, key) if p != me]
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    return pids
