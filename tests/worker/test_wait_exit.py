"""paralab_core.procs.wait_exit, the wait of the worker's and the shim's supervising loops: it
returns False while the child lives, True once it has exited (reaped, its code kept), and it
is woken by the exit itself, not by its timeout: the loops call it with 0.1 s, and a wait
that slept through its timeout added that much to every run's end. Here the timeout is an
hour; the test's guard is 30 s."""

from __future__ import annotations

import subprocess
import sys
import threading

from paralab_core.procs import wait_exit


def _child():
    # lives until its stdin closes, then exits 3
    return subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read(); sys.exit(3)"],
                            stdin=subprocess.PIPE)


def test_false_while_alive_true_once_exited():
    p = _child()
    try:
        assert wait_exit(p, 0.05) is False and p.returncode is None
    finally:
        p.stdin.close()
    p.wait(30)
    assert wait_exit(p, 0.05) is True and p.returncode == 3


def test_woken_by_the_exit_not_the_timeout():
    p = _child()
    got = []
    t = threading.Thread(target=lambda: got.append(wait_exit(p, 3600.0)), daemon=True)
    t.start()
    t.join(0.2)
    assert t.is_alive(), "returned while the child was alive"
    p.stdin.close()
    t.join(30)
    assert got == [True] and p.returncode == 3

