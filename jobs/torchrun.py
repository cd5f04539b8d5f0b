"""torchrun, leaving without interpreter finalization, with warm ranks for paralab's own jobs.

`python -m jobs.torchrun ARGS` runs torch's own launcher (`torch.distributed.run.main`, the
same arguments, the same agent, rendezvous, restarts and failure report) and, once it has
returned or raised, runs the atexit handlers and leaves as the ranks do (jobs/entry.py
exit_now: flush, then `os._exit`).

Why no teardown: after `import torch` the interpreter's teardown (module cleanup and torch's
C++ objects) took 1-2 s of wall time and about 0.5 CPU-s on a 2-core machine, after the ranks
had exited and the agent's work was done: every run ended that much later than its job
(measured: docs/benchmarks.md).

Warm ranks: for the job modules of WARM_MODULES (`-m jobs.train` and the benchmarks: this
project's code, not a user's script) the ranks are not each a new interpreter (`python -u -m
MODULE`): torch's launcher starts them as it starts a function entrypoint (its
MultiprocessContext: the same environment per rank, the same log redirection and tee, the same
failure report) with `start_method="forkserver"`, the server having imported torch and the job
once. Each rank then skips its own `import torch` and the job's imports: most of what a short
run costs (bench/rank_startup.py, docs/benchmarks.md). Not "fork" from the agent: the agent
has threads by then (its rendezvous store's server), and a rank forked while one of them held
a lock hung before its first line (seen once in a full test run, a 4-rank launch); the fork
server is a single-threaded process that only imports. It is itself a fork of the agent, made
right after the agent's `import torch` while the agent still has one thread (in_process; an
exec'd server, importing torch a second time, where it has more: OMP_NUM_THREADS > 1). The
rank puts back what a fresh process would have (signal handlers, unbuffered output, and its
name, RANK_COMM: its /proc environment is the agent's, without RANK, so the worker finds ranks
by that name too, worker/hang.py). A user's script (`jobs.script_runner`) keeps a process of
its own, and so does every rank on a host where torch sees a CUDA device (cuda_host);
START_ENV=exec turns this off everywhere, START_ENV=fork widens it to any module or script.

The exit status is the launcher's: 0 when it returns, a SystemExit's code (argparse's 2 for
bad arguments), 1 with the traceback on stderr for any exception (a failed rank's
ChildFailedError and its root-cause table, a signal's SignalException), as `python -m
torch.distributed.run` ends."""

from __future__ import annotations

import atexit
import ctypes
import io
import multiprocessing
import os
import runpy
import signal
import sys
import threading
import traceback
import warnings
from multiprocessing import forkserver, resource_tracker, util

from jobs import entry
from jobs.entry import exit_now

MODULE = "jobs.torchrun"  # what `python -m` runs: the worker's launch and the test launchers
# paralab's own job modules: their ranks come from the fork server unless START_ENV says "exec"
WARM_MODULES = ("jobs.train", "jobs.collective_bench", "jobs.compute_bench")
# a user's script: always a process of its own (it may hold state a fork would share, or leave
# through os._exit(0), which a forked rank must not)
COLD_MODULES = ("jobs.script_runner",)
# "exec": every rank its own interpreter, as torchrun does (a debugger, a comparison); "fork":
# every rank forks, any module or script but COLD_MODULES (the launcher of this repository's
# tests and benchmarks, devtools/launch.py: scripts written for it); unset: WARM_MODULES fork
START_ENV = "PARALAB_RANK_START"
RANK_COMM = "paralab-rank"  # a forked rank's process name (/proc/PID/comm)
_PR_SET_NAME = 15  # prctl(2)
_NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"  # torch.cuda.is_available without cuInit

# A rank runs its target as __main__ (and multiprocessing runs this module as __mp_main__) after
# the fork server's preload imported it: runpy's warning about that is this design, not a slip.
# Set at import, so the agent, the server and (inherited) every rank have it.
warnings.filterwarnings("ignore", message=".* found in sys.modules after import of package",
                        category=RuntimeWarning)


def exit_code(exc: SystemExit) -> int:
    """What the interpreter would exit with for an uncaught SystemExit (a message: 1)."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    sys.stderr.write(f"{exc.code}\n")
    return 1


def warm(cmd_args: list[str], env=os.environ) -> list[str] | None:
    """For the command torch's launcher built for each rank (`-u [-m] TARGET ARGS...`), what a
    rank from the fork server runs instead (rank_main's arguments: "module" or "path", the
    target, its arguments), or None when each rank runs a command of its own."""
    mode = env.get(START_ENV, "")
    if mode == "exec" or cmd_args[:1] != ["-u"]:
        return None
    if cmd_args[1:2] == ["-m"] and len(cmd_args) >= 3:
        module = cmd_args[2]
        if module in COLD_MODULES or (module not in WARM_MODULES and mode != "fork"):
            return None
        return ["module", *cmd_args[2:]]
    if mode == "fork" and len(cmd_args) >= 2 and cmd_args[1].endswith(".py"):
        return ["path", *cmd_args[1:]]
    return None


def as_fresh_process(name: str = RANK_COMM) -> None:
    """What a forked rank takes back from a new interpreter: default signal
    handlers (torchrun's agent's raise its SignalException; jobs/trace.py installs its own only over
    the defaults), `python -u`'s unbuffered output (whole lines: ranks sharing a terminal do not
    cut each other's), a name of its own, and exit_now leaving through the launcher."""
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for stream in ("stdout", "stderr"):
        old = getattr(sys, stream)
        old.flush()
        raw = open(old.fileno(), "wb", buffering=0, closefd=False)  # noqa: SIM115 - sys's own
        setattr(sys, stream, io.TextIOWrapper(raw, encoding=old.encoding, errors=old.errors,
                                              line_buffering=True))
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        pass
    entry.FORKED_RANK = True


def rank_main(kind: str, target: str, *args: str) -> int:
    """One rank from the fork server (torch's function entrypoint): the module or script run
    as `__main__`, as `python -u -m MODULE` / `python -u SCRIPT` would. It returns: the
    launcher waits for every rank's return value, so a rank must not `os._exit(0)` (exit_now
    raises SystemExit here). An exception is printed on the rank's stderr as an interpreter
    prints it, then raised for torch's failure report."""
    as_fresh_process()
    if (os.environ.get("OMP_NUM_THREADS") or "").isdigit():  # torch read it at import, in the
        import torch  # server, maybe before torchrun set it: as a new process would read it

        torch.set_num_threads(max(1, int(os.environ["OMP_NUM_THREADS"])))
    sys.argv = [target, *args]
    try:
        if kind == "module":
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
            runpy.run_path(target, run_name="__main__")
    except SystemExit as exc:
        if exit_code(exc) == 0:
            return 0
        raise
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        raise
    return 0


def cuda_host() -> bool:
    """Whether torch sees a CUDA device here, asked without initialising CUDA in the agent
    (NVML, where torch can). On such a host every rank gets its own interpreter, torchrun's
    default: forked GPU ranks are not tested here."""
    import torch

    if not torch.backends.cuda.is_built():
        return False
    before = os.environ.get(_NVML_CHECK)
    os.environ[_NVML_CHECK] = "1"
    try:
        return torch.cuda.is_available()
    finally:
        if before is None:
            del os.environ[_NVML_CHECK]
        else:
            os.environ[_NVML_CHECK] = before


def preload(forked: list[str]) -> list[str]:
    """What the fork server imports once, before it forks any rank (a script is run only in the
    ranks: it may not guard its __main__ block)."""
    return ["torch", MODULE, *([forked[1]] if forked[0] == "module" else [])]


def in_process(spawnv_passfds):
    """multiprocessing's spawnv_passfds (how it starts its helper processes: `python -c CODE`
    with only `passfds` kept), running CODE in a fork of this process instead of a new
    interpreter, when this process has one thread (a fork of a threaded process can copy a lock
    some thread held, and hang). The fork server so started has torch imported already: no
    second `import torch` per launch. What else a fork would keep is dropped as exec drops it:
    every other file descriptor is closed, and the server's lock (held by the caller during
    the fork) is a new one."""
    def spawn(path, args, passfds):
        code = args[-1] if args[-2:-1] == ["-c"] else ""
        if (not code.startswith("from multiprocessing.")
                or len(os.listdir("/proc/self/task")) != 1):
            return spawnv_passfds(path, args, passfds)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid:
            return pid
        status = 1
        try:
            low = 3
            for fd in sorted(set(passfds)):
                os.closerange(low, fd)
                low = fd + 1
            os.closerange(low, os.sysconf("SC_OPEN_MAX"))
            forkserver._forkserver._lock = threading.Lock()
            resource_tracker._resource_tracker._fd = None  # closed above: as a new process has it
            resource_tracker._resource_tracker._pid = None
            exec(code, {"__name__": "__mp_helper__"})  # noqa: S102 - multiprocessing's own code
            status = 0
        except SystemExit as exc:  # the server's way out: its last client went away
            status = exit_code(exc)
        except BaseException:  # noqa: BLE001 - reported, as the interpreter would
            traceback.print_exc()
        finally:
            os._exit(status)
    return spawn


def start_server(argv: list[str], env=os.environ) -> None:
    """Start the fork server now, forked from this process (in_process), right after torch's
    import and before torch's launcher starts any thread (its rendezvous store's server): when
    torchrun's arguments name a warm target (guessed from `-m MODULE` or a `.py` path: a wrong
    guess costs an idle fork) on a host without an NVIDIA driver (there cuda_host decides
    later, and an exec'd server is started if it says no). The server imports the job module
    while the agent meets its peers."""
    forked = None
    for i, a in enumerate(argv):
        if a in ("-m", "--module") and i + 1 < len(argv):
            forked = warm(["-u", "-m", argv[i + 1]], env)
            break
        if a.endswith(".py"):
            forked = warm(["-u", a], env)
            break
    if forked is None or os.path.exists("/proc/driver/nvidia"):
        return
    multiprocessing.set_forkserver_preload(preload(forked))
    spawnv_passfds = util.spawnv_passfds
    util.spawnv_passfds = in_process(spawnv_passfds)
    try:
        forkserver.ensure_running()
    finally:
        util.spawnv_passfds = spawnv_passfds


def forking(config_from_args, cuda=cuda_host):
    """torch's config_from_args, with the ranks of a warm target forked by a fork server (not on
    a CUDA host)."""
    def config(args):
        cfg, cmd, cmd_args = config_from_args(args)
        forked = warm(cmd_args)
        if forked is None or cuda():
            return cfg, cmd, cmd_args
        multiprocessing.set_forkserver_preload(preload(forked))  # if not started already
        cfg.start_method = "forkserver"
        return cfg, rank_main, forked
    return config


def tail_logfile(header, file, dst, finished, interval_sec, log_line_filter=None):
    """torch's tail_logfile (elastic/multiprocessing/tail_log.py: a thread per tee'd rank
    stream), waiting on `finished` instead of sleeping: at the end of a run torch's TailLog.stop
    sets it and then waits for every tailer, which slept out its 0.1 s first (measured with
    the worker's `--tee 3`: every launch 0.15 s longer than without)."""
    while not os.path.exists(file):
        if finished.is_set():
            return
        finished.wait(interval_sec)
    with open(file, errors="replace") as fp:
        while True:
            line = fp.readline()
            if line:
                if log_line_filter and log_line_filter(line):
                    dst.write(f"{header}{line}")
            elif finished.is_set():  # EOF once the producer has finished: done
                break
            else:
                finished.wait(interval_sec)


TAIL_PARAMS = ("header", "file", "dst", "finished", "interval_sec", "log_line_filter")


def quick_tail() -> bool:
    """tail_logfile in place of torch's, when torch's has the signature it was written for
    (another torch keeps its own)."""
    import inspect

    from torch.distributed.elastic.multiprocessing import tail_log
    if tuple(inspect.signature(tail_log.tail_logfile).parameters) != TAIL_PARAMS:
        return False
    tail_log.tail_logfile = tail_logfile
    return True


def main(argv: list[str]) -> int:
    import torch.distributed.run as torchrun

    start_server(argv)
    quick_tail()

    torchrun.config_from_args = forking(torchrun.config_from_args)
    sys.argv[0] = "torchrun"  # argparse's prog, as torch's console script names it
    try:
        torchrun.main(argv)
        return 0
    except SystemExit as exc:
        return exit_code(exc)
    except BaseException:  # noqa: BLE001 - reported as the default hook would, then the status
        traceback.print_exc()
        return 1
    finally:
        # the fork server (if any) ends and is reaped here, not orphaned: its CPU time and its
        # ranks' reach whoever waits on this launch (resource usage of reaped children)
        stop = getattr(forkserver._forkserver, "_stop", None)
        if stop is not None:
            stop()


if __name__ == "__main__":
    code = main(sys.argv[1:])
    atexit._run_exitfuncs()  # logging's shutdown and the like: what finalization would run
    exit_now(code)
