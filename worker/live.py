"""What the worker streams while a job runs: its log lines (LogShipper); the growing per-rank
trace files, shipped as appended byte ranges so the backend holds a live copy and serves the run
page's figures from the same analysis it uses after the run (`jobs.analysis` over partial
traces); and the job's output filtered of interpreter warnings, which go to the worker's own
log instead of the user's.

Traces are shipped whole lines only (up to the last newline), each chunk tagged with its byte
offset: the backend writes at that offset, so a retried chunk is harmless and a lost one is
re-sent (the offset only advances on success). At the end of the run the worker uploads every
file whole, which replaces the live copy."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import httpx

from worker.client import BackendClient, BackendUnavailable

log = logging.getLogger(__name__)

LIVE_GLOBS = ("trace-rank*.jsonl",)
MAX_CHUNK = 4 << 20  # bytes per request: a slow backend gets bounded requests


# 4xx answers that say "not now" rather than "never": the batch stays pending
RETRY_LATER = (408, 425, 429)


class LogShipper:
    """Numbers every line and ships batches in the background; a batch the backend could not
    take (unreachable, 5xx, 507, 429) stays pending and is sent again (the backend ignores
    sequence numbers it already has). An answer is final: a 4xx refusal, or a 200 naming lines
    it could not store as sent (`rejected`), is logged and the batch is never sent again, so
    one bad line cannot hold back the rest of the run's log."""

    def __init__(self, client: BackendClient, run_id: str, interval: float = 0.5,
                 node: int | None = None):
        self._client, self._run_id, self._interval = client, run_id, interval
        # a node of a multi-host run numbers its own lines; the backend gives them the run's
        self._node = node
        self._pending: list[dict] = []
        self._seq = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="log-shipper")
        self._thread.start()

    def add(self, line: str) -> None:
        with self._lock:
            self._pending.append({"seq": self._seq, "ts": datetime.now(UTC).isoformat(),
                                  "line": line[:65536]})
            self._seq += 1

    def _flush(self, retry_for_s: float) -> bool:
        while True:
            with self._lock:
                batch = self._pending[:1000]
            if not batch:
                return True
            try:
                if self._node is None:
                    answer = self._client.logs(self._run_id, batch, retry_for_s=retry_for_s)
                else:
                    answer = self._client.node_logs(self._run_id, self._node, batch,
                                                    retry_for_s=retry_for_s)
            except BackendUnavailable:
                return False
            except httpx.HTTPStatusError as exc:  # 4xx: refused for good; the run goes on
                if exc.response.status_code in RETRY_LATER:
                    return False
                log.warning("run %s: the backend refused %d log lines: %s", self._run_id,
                            len(batch), exc)
            else:
                for bad in (answer or {}).get("rejected") or ():
                    log.warning("run %s: log line %s: %s", self._run_id,
                                _seq_of(batch, bad.get("loc")), bad.get("msg"))
            with self._lock:
                del self._pending[:len(batch)]

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            self._flush(retry_for_s=0)

    def close(self, retry_for_s: float = 1800) -> None:
        self._stop.set()
        self._thread.join()
        if not self._flush(retry_for_s=retry_for_s):  # e.g. 507: the backend's disk is full
            log.warning("run %s: %d log lines could not be delivered to the backend",
                        self._run_id, len(self._pending))


def _seq_of(batch: list[dict], loc) -> str:
    """The seq (and field) a `rejected` entry's loc (["body", "lines", i, field]) names."""
    try:
        i, field = loc[2], loc[3]
        return f"{batch[i]['seq']} ({field})"
    except (IndexError, KeyError, TypeError):
        return repr(loc)


class TraceShipper:
    """Every `interval` s, ships what the job appended to its trace files since the last
    successful shipment."""

    def __init__(self, client: BackendClient, run_id: str, out_dir: Path,
                 interval: float = 1.0) -> None:
        self._client, self._run_id, self._out, self._interval = client, run_id, out_dir, interval
        self._sent: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="trace-shipper")
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.ship()
            except BackendUnavailable:
                pass  # try again next round: the offsets did not move
            except Exception:  # noqa: BLE001 - live figures are best effort; the run goes on
                log.exception("live trace shipping of run %s failed", self._run_id)

    def ship(self) -> int:
        """One round: returns the bytes shipped."""
        total = 0
        for pattern in LIVE_GLOBS:
            for p in sorted(self._out.glob(pattern)):
                total += self._ship_file(p)
        return total

    def _ship_file(self, path: Path) -> int:
        rel = path.name
        off = self._sent.get(rel, 0)
        with open(path, "rb") as f:
            f.seek(off)
            data = f.read(MAX_CHUNK)
        end = data.rfind(b"\n")
        if end < 0:
            return 0  # no complete line yet
        chunk = data[:end + 1]
        try:
            self._client.append(self._run_id, rel, off, chunk)
        except httpx.HTTPStatusError as exc:
            if exc.response.status_code != 409:
                raise
            self._sent[rel] = 0  # the backend's copy is shorter than we thought: start over
            return 0
        self._sent[rel] = off + len(chunk)
        return len(chunk)

    def close(self) -> dict[str, int]:
        """Stop, ship what the job wrote last (it has ended: the files no longer grow), and
        return the bytes of each file the backend holds, so the upload after the job does
        not send them again."""
        self._stop.set()
        self._thread.join()
        try:
            while self.ship():
                pass
        except BackendUnavailable:
            pass  # what did not get through is uploaded whole
        except Exception:  # noqa: BLE001 - same: the upload sends the whole file
            log.exception("final trace shipment of run %s failed", self._run_id)
        return dict(self._sent)


class LiveConversion:
    """Every `interval` s, the row groups of the job's traces that can no longer change go to
    Parquet (jobs/analysis/storage/convert_live.py), in a thread at a lower priority than the job's
    ranks: the conversion fills the host's idle time and gives way to the job. `analyse`:
    the row groups written also feed the analysis of the steps every rank has passed
    (jobs/analysis/analyze_live.py; a run whose ranks are all on this host)."""

    def __init__(self, out_dir: Path, interval: float, analyse: bool = False) -> None:
        from jobs.analysis.storage.convert_live import LiveRun
        self.run, self._interval = LiveRun(out_dir, analyse=analyse), interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="live-convert")
        self._thread.start()

    def _loop(self) -> None:
        with contextlib.suppress(OSError, AttributeError):  # Linux: a thread's own nice value
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        while not self._stop.wait(self._interval):
            try:
                self.run.poll(self._stop)  # a stop someone waits on is not held up by it
            except Exception:  # noqa: BLE001 - the post-run conversion converts it whole
                log.exception("live conversion of %s failed", self.run.out)

    def close(self):
        """Stops polling (the job has ended) within a block; returns the LiveRun for
        convert_run_dir, which reads the rest."""
        self._stop.set()
        self._thread.join()
        return self.run


# "/path/x.py:12: FutureWarning: ..." (optionally after torchrun's "[default0]:" rank prefix),
# followed by the offending source line, indented.
_WARNING = re.compile(r"^(\[default\d+\]:)?\S+\.py:\d+: [A-Za-z]*Warning: ")
_RANK = re.compile(r"^\[default\d+\]:")


class OutputFilter:
    """Splits the job's output: interpreter warnings (and the source line Python prints under
    each) go to `aside`, everything else to `keep`."""

    def __init__(self, keep: Callable[[str], None], aside: Callable[[str], None]) -> None:
        self._keep, self._aside = keep, aside
        self._in_warning: set[str] = set()  # rank prefixes whose next line is a warning's source
        # Set when the worker stops the job (cancel, timeout): torchrun's own lines from then
        # on are the SignalException traceback of being stopped, noise to the user.
        self.stopping = False

    def __call__(self, line: str) -> None:
        m = _RANK.match(line)
        prefix = m.group(0) if m else ""
        body = line[len(prefix):]
        if self.stopping and not prefix and not line.startswith("[paralab]"):
            self._aside(line)
        elif _WARNING.match(line):
            self._in_warning.add(prefix)
            self._aside(line)
        elif prefix in self._in_warning and body.startswith("  "):
            self._in_warning.discard(prefix)
            self._aside(line)
        else:
            self._in_warning.discard(prefix)
            self._keep(line)
