"""The job's own supervisor: `python -m worker.shim --grace S -- torchrun ...`.

It sits between the worker and torchrun so that stopping a job never depends on the worker
being alive or on torchrun's own shutdown: on SIGTERM / SIGINT, or as soon as its parent (the
worker) is gone — killed outright included — it sends SIGTERM to torchrun (which stops its
ranks), waits `grace` seconds, then SIGKILLs every process carrying the run's ID. It also
reaps ranks that outlive torchrun after a normal exit. Standard library only: it starts in
milliseconds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from paralab_core.procs import pdeathsig_preexec, wait_exit
from worker.procs import PROC_KEY, kill_run_processes


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[0] != "--grace" or argv[2] != "--":
        sys.stderr.write("usage: python -m worker.shim --grace SECONDS -- COMMAND...\n")
        return 2
    grace, cmd = float(argv[1]), argv[3:]
    key = os.environ.get(PROC_KEY, "")
    parent = os.getppid()
    pdeathsig_preexec(signal.SIGTERM)()  # this process too learns of the worker's death
    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: stop.append(signum))
    if os.getppid() != parent:  # the worker died before the signal was armed
        stop.append(signal.SIGTERM)
    child = subprocess.Popen(cmd, preexec_fn=pdeathsig_preexec(signal.SIGTERM))
    while not stop and os.getppid() == parent and not wait_exit(child, 0.1):
        pass
    if child.poll() is None:
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(grace)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
    if key:
        kill_run_processes(key)  # ranks left behind by torchrun, and nothing else
    rc = child.returncode
    return 128 - rc if rc < 0 else rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
