"""torchrun, leaving without interpreter finalization: `python -m jobs.torchrun ARGS` runs
torch's own launcher (`torch.distributed.run.main`, the same arguments, the same agent,
rendezvous, restarts and failure report) and, once it has returned or raised, runs the atexit
handlers and leaves as the ranks do (jobs/entry.py exit_now: flush, then `os._exit`).

Why: after `import torch` the interpreter's teardown (module cleanup and torch's C++ objects)
took 1-2 s of wall time and about 0.5 CPU-s on this 2-core machine, after the ranks had exited
and the agent's work was done: every run ended that much later than its job (measured:
docs/benchmarks.md).

The exit status is the launcher's: 0 when it returns, a SystemExit's code (argparse's 2 for
bad arguments), 1 with the traceback on stderr for any exception (a failed rank's
ChildFailedError and its root-cause table, a signal's SignalException), as `python -m
torch.distributed.run` ends."""

from __future__ import annotations

import atexit
import sys
import traceback

from jobs.entry import exit_now

MODULE = "jobs.torchrun"  # what `python -m` runs: the worker's launch and the test launchers



def exit_code(exc: SystemExit) -> int:
    """What the interpreter would exit with for an uncaught SystemExit (a message: 1)."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    sys.stderr.write(f"{exc.code}\n")
    return 1


def main(argv: list[str]) -> int:
    from torch.distributed.run import main as launch

    sys.argv[0] = "torchrun"  # argparse's prog, as torch's console script names it
    try:
        launch(argv)
        return 0
    except SystemExit as exc:
        return exit_code(exc)
    except BaseException:  # noqa: BLE001 - reported as the default hook would, then the status
        traceback.print_exc()
        return 1


if __name__ == "__main__":
    code = main(sys.argv[1:])
    atexit._run_exitfuncs()  # logging's shutdown and the like: what finalization would run
    exit_now(code)
