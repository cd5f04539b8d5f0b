"""The hang watchdog and the post-mortem of a run that went wrong (docs/faults.md).

`HangWatch` is polled by the supervisor: the job's ranks keep flight files (jobs/trace.py: per
group, the collective entered and the last completed, and when anything last completed);
when no rank has completed a step or a collective for `runtime.hang_timeout_s`, the run is
hung. Before the job is stopped every rank is asked for its Python stack (SIGUSR1: the job's
faulthandler writes `stack-rank{R}.txt`, which works while the rank is blocked inside a C++
collective, where no Python signal handler could run). `post_mortem` then writes the
diagnosis (jobs/analysis/diagnose.py) from those files and the exit codes torchrun printed."""

from __future__ import annotations

import logging
import os
import signal
import time
from collections import deque
from pathlib import Path

from jobs.analysis.diagnose import exit_codes_from_log, last_progress_ns, write_diagnosis
from jobs.torchrun import RANK_COMM
from worker.procs import PROC_KEY, pids_with_env

log = logging.getLogger(__name__)
POLL_S = 1.0  # how often the flight files are read (a stat and a small JSON per rank)


class HangWatch:
    def __init__(self, out: Path, timeout_s: float, clock=time.time_ns, poll_s: float = POLL_S):
        self.out, self.timeout_ns, self.clock = out, int(timeout_s * 1e9), clock
        self.poll_s = poll_s
        self.started_ns = clock()
        self.next_poll = 0.0
        self.last_ns = self.started_ns

    def stalled_s(self) -> float | None:
        """Seconds without progress once that exceeds the timeout (else None). Progress is the
        latest completion on any rank, on the ranks' aligned clock (rank 0's wall clock, the
        same host's as ours). Until a rank's tracer has written its first flight file (torch
        imported, process group up: seconds under load) the clock does not run: start-up is
        `timeout_s`'s business, so a short hang timeout cannot fire on a slow start; nor
        between torchrun attempts (the ranks of a restart move the old files away)."""
        if self.timeout_ns <= 0:
            return None
        now = time.monotonic()
        if now < self.next_poll:
            return None
        self.next_poll = now + self.poll_s
        last = last_progress_ns(self.out)
        if last is None:
            self.last_ns = self.clock()
            return None
        self.last_ns = max(self.last_ns, last)
        stalled = self.clock() - self.last_ns
        return stalled / 1e9 if stalled > self.timeout_ns else None

    def hung(self, stalled_s: float, alive: int, local_ranks: int) -> bool:
        """Whether a stall (stalled_s's answer) is a hang, given how many of the `local_ranks`
        this host started are alive. None alive: they failed and torchrun is winding down.
        Fewer than started: a rank has left (a crash, a non-finite loss) and its failure is
        ending the job (torchrun stops the others), which can take longer than a short
        timeout on a loaded host; reported as a hang only if the stall outlasts one more
        timeout, so the run ends `failed` with its cause rather than `hung`."""
        if alive == 0:
            return False
        return alive >= local_ranks or stalled_s * 1e9 >= 2 * self.timeout_ns


def rank_pids(key: str) -> list[int]:
    """The job's rank processes on this host: they carry the run's key (procs.proc_key) and
    torchrun's RANK variable (the shim and torchrun itself carry only the key), or, for a rank
    from jobs/torchrun.py's fork server (/proc shows the agent's environment), its process name."""
    return pids_with_env(PROC_KEY, key, having="RANK", named=RANK_COMM)


def dump_stacks(key: str, out: Path, wait_s: float = 2.0) -> int:
    """SIGUSR1 to every rank, then wait (up to `wait_s`) for their stack files; returns how
    many ranks were asked."""
    pids = rank_pids(key)
    before = {p: p.stat().st_size for p in out.glob("stack-rank*.txt")}
    for pid in pids:
        try:
            os.kill(pid, signal.SIGUSR1)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        grown = [p for p in out.glob("stack-rank*.txt") if p.stat().st_size > before.get(p, 0)]
        if len(grown) >= len(pids):
            break
        time.sleep(0.1)
    time.sleep(0.2)  # let the last writer finish its lines
    return len(pids)


class LogTail:
    """The job's last output lines: torchrun's failure report names each failed rank's exit
    code there."""

    def __init__(self, n: int = 2000):
        self.lines: deque[str] = deque(maxlen=n)

    def __call__(self, line: str) -> None:
        self.lines.append(line)

    def text(self) -> str:
        return "\n".join(self.lines)


def post_mortem(out: Path, status: str, tail: LogTail) -> dict | None:
    """The diagnosis of a run that did not succeed (written to OUT/diagnosis.json), or None
    when there is nothing to diagnose from (no flight file: the job never started)."""
    if not any(out.glob("flight-rank*.json")) and not any(out.glob("error-rank*.txt")):
        return None
    try:
        return write_diagnosis(out, status=status, exit_codes=exit_codes_from_log(tail.text()))
    except Exception:  # noqa: BLE001 - the run's outcome is reported without it
        log.exception("diagnosis of %s failed", out)
        return None
