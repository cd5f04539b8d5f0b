"""The Celery task: run(run_id) claims the run, launches torchrun and supervises it.

Supervision: logs are streamed to the backend as they appear; `runtime.timeout_s` is enforced;
a run without progress on any rank for `runtime.hang_timeout_s` is stopped as `hung`, with
every rank's stack and a diagnosis (worker/hang.py); a resumed run's checkpoint is downloaded
from the backend before launch;
cancel is cooperative (the backend's answer to each heartbeat carries the flag) and forceful
(SIGTERM to torchrun, which stops its ranks, then SIGKILL to every process carrying the run's
ID); the job gets a parent-death signal so it also stops when this worker is killed outright.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
from celery import shared_task
from celery.app import trace as celery_trace
from celery.signals import worker_ready, worker_shutdown, worker_shutting_down

from jobs.analysis.diagnose import failure_text
from jobs.ckpt_index import attempts
from jobs.spec import parse_spec
from paralab_core.config import Settings, get_settings, job_timeout_s
from paralab_core.procs import pdeathsig_preexec, wait_exit
from paralab_core.queue import TASK_NAME, worker_host, worker_name
from worker.client import BackendClient
from worker.hang import HangWatch, LogTail, dump_stacks, post_mortem, rank_pids
from worker.launch import build_argv, build_env, supervised
from worker.live import LiveConversion, LogShipper, OutputFilter, TraceShipper
from worker.procs import kill_run_processes, proc_key
from worker.provenance import devices, provenance

log = logging.getLogger(__name__)
logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per heartbeat is noise
# Celery's default line reads "Task paralab.run[…] succeeded in 3s: 'cancelled'": the task did
# its job (it supervised the run to an end); what it returns is the run's outcome.
celery_trace.LOG_SUCCESS = ("Task %(name)s[%(id)s] done in %(runtime)ss; "
                            "the run ended %(return_value)s")

SHUTDOWN = threading.Event()
# The suffixes of a file being written atomically (renamed when complete): never a run file.
PARTIAL = (".part", ".tmp")
_busy = 0
_busy_lock = threading.Lock()


def _read_text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _client(settings: Settings) -> BackendClient:
    return BackendClient(settings.url, settings.resolved_worker_token(),
                         worker=worker_name(settings), host=worker_host(settings))


@shared_task(name=TASK_NAME, bind=True, acks_late=True)
def run(self, run_id: str) -> str:
    settings = get_settings()
    client = _client(settings)
    try:
        try:
            claim = client.claim(run_id, worker_name(settings), self.request.id)
        except httpx.HTTPStatusError as exc:
            if exc.response.status_code != 401:
                raise
            # The message is consumed; the backend's reconciler publishes it again, and fails
            # the run with this reason if no worker with the right credential takes it.
            log.error("run %s not launched: the backend refuses this worker's credential "
                      "(401); PARALAB_WORKER_TOKEN does not match the backend's", run_id)
            return "refused: wrong worker credential"
        if not claim["launch"]:
            log.info("run %s not launched: %s", run_id, claim["reason"])
            return f"skipped: {claim['reason']}"
        with busy():
            return JobSupervisor(run_id, claim["spec"], client, settings).run()
    finally:
        client.close()


@contextlib.contextmanager
def busy():
    """A job slot of this worker is taken (its heartbeat reports the count)."""
    global _busy
    with _busy_lock:
        _busy += 1
    try:
        yield
    finally:
        with _busy_lock:
            _busy -= 1


class JobSupervisor:
    """One run on this worker's host (worker/nodes.py NodeSupervisor: one node of a
    multi-host run, with the hooks below overridden)."""

    node: int | None = None

    def __init__(self, run_id: str, spec: dict, client: BackendClient, settings: Settings):
        self.run_id, self.spec, self.client, self.settings = run_id, spec, client, settings
        self.dir = settings.work_dir / run_id
        self.out = self.dir / "out"
        self.live = None  # the live conversion's LiveRun once the job has run
        self.shipped: dict[str, int] = {}  # trace file -> bytes the backend has (shipped live)

    # -- hooks of a multi-host node ------------------------------------------------------------
    def _beat(self) -> dict | None:
        return self.client.heartbeat(self.run_id)

    def _rendezvous(self):
        """None: a one-host run (torchrun --standalone)."""
        return None

    @property
    def key(self) -> str:
        """What finds this run's (node's) processes on this host (worker/procs.py)."""
        return proc_key(self.run_id, self.node)

    def say(self, msg: str) -> None:
        self.logs.add(f"[paralab] {msg}")

    def run(self) -> str:
        self.out.mkdir(parents=True, exist_ok=True)
        spec_path = self.dir / "spec.json"
        spec_path.write_text(json.dumps(self.spec, indent=1))
        self.logs = LogShipper(self.client, self.run_id, node=self.node)
        self.tail = LogTail()
        keep = self.logs.add

        def keep_and_tail(line: str) -> None:
            self.tail(line)
            keep(line)
        self.output = OutputFilter(keep_and_tail, lambda line: log.info(
            "run %s: %s", self.run_id, line))
        try:
            resume_dir = self._fetch_checkpoint()
        except Exception as exc:  # noqa: BLE001 - reported as the run's failure
            self.say(f"could not download the checkpoint to resume from: {exc}")
            self.logs.close()
            self._finish("failed", -1, f"could not download the checkpoint to resume from: "
                         f"{exc}", None)
            return "failed"
        try:
            workdir = self._fetch_workdir()
        except Exception as exc:  # noqa: BLE001 - reported as the run's failure
            self.say(f"could not prepare the working directory: {exc}")
            self.logs.close()
            self._finish("failed", -1, f"could not prepare the working directory: {exc}", None)
            return "failed"
        try:
            rdzv = self._rendezvous()
        except Exception as exc:  # noqa: BLE001 - reported as the run's (node's) failure
            self.say(f"no rendezvous: {exc}")
            self.logs.close()
            self._finish("failed", -1, f"no rendezvous: {exc}", None)
            return "failed"
        argv = supervised(build_argv(self.spec, python=sys.executable, spec_path=spec_path,
                                     out_dir=self.out, log_dir=self.dir / "torchrun-logs",
                                     resume_dir=resume_dir, rdzv=rdzv, workdir=workdir),
                          python=sys.executable, grace_s=self.settings.kill_grace_s)
        env = build_env(os.environ, run_id=self.run_id, omp_threads=self.settings.job_omp_threads,
                        host_label=worker_host(self.settings), node=self.node)
        timeout = job_timeout_s(self.spec, self.settings.max_job_timeout_s)
        self.hang = HangWatch(self.out, float(self.spec["runtime"].get("hang_timeout_s", 0)))
        where = worker_host(self.settings) + ("" if self.node is None else f", node {self.node}")
        self.say(f"launching on {where}: {shlex.join(argv)}")
        proc = subprocess.Popen(argv, env=env, cwd=self.dir, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=pdeathsig_preexec(signal.SIGTERM))
        reader = threading.Thread(target=self._read, args=(proc,), daemon=True)
        reader.start()
        traces = TraceShipper(self.client, self.run_id, self.out)
        # a node of a multi-host run holds some ranks only: no live analysis there
        analyse = self.settings.live_analysis and self.node is None and \
            self.spec.get("kind") == "train"
        conversion = LiveConversion(self.out, self.settings.live_convert_s, analyse) \
            if self.settings.live_convert_s > 0 else None
        try:
            outcome, reason = self._supervise(proc, timeout)
            rc = proc.wait()
        finally:
            self.shipped = traces.close()
            if conversion is not None:
                self.live = conversion.close()
        wrapped = threading.Event()
        threading.Thread(target=self._beat_until, args=(wrapped,), daemon=True,
                         name="wrap-up-heartbeat").start()
        try:
            return self._wrap_up(reader, outcome, reason, rc)
        finally:
            wrapped.set()

    def _fetch_workdir(self) -> Path | None:
        """A script run's working directory: its upload fetched over the worker channel and
        unpacked with the same checks the backend made (paralab_core/archives.py), into the
        run's folder beside OUT (so it is not uploaded back). None for the other kinds."""
        if self.spec.get("kind") != "script":
            return None
        from paralab_core import archives
        workdir = self.dir / "workdir"
        sha = (self.spec.get("script") or {}).get("upload") or ""
        if not sha:  # a module installed where the job runs ('-m pkg.module')
            workdir.mkdir(parents=True, exist_ok=True)
            return workdir
        archive = self.dir / "workdir.archive"
        self.client.upload_archive(sha, archive)
        try:
            members = archives.unpack(archive, workdir, self.settings.archive_limits)
        finally:
            archive.unlink(missing_ok=True)
        self.say(f"working directory {sha[:12]}: {len(members)} entries unpacked")
        return workdir

    def _fetch_checkpoint(self):
        """The parent run's checkpoint folder, downloaded next to this run's own (None when
        the spec does not resume)."""
        res = self.spec.get("resume") or {}
        if not res.get("run_id"):
            return None
        parent, step = res["run_id"], int(res["step"])
        listing = self.client.checkpoint_files(parent, step)
        base = self.dir / "resume"
        total = sum(f["size"] for f in listing["files"])
        self.say(f"downloading checkpoint step {step} of run {parent} ({len(listing['files'])}"
                 f" files, {total / 1e6:.1f} MB)")
        for f in listing["files"]:
            self.client.download(parent, f["path"], base / f["path"])
        return base / listing["folder"]

    def _beat_until(self, done: threading.Event) -> None:
        """Heartbeats while the job's results are analysed and uploaded (minutes for big
        traces): the run is still this worker's, not lost."""
        while not done.wait(self.settings.run_heartbeat_s):
            self._beat()

    def _wrap_up(self, reader, outcome: str | None, reason: str, rc: int) -> str:
        status, error, diagnosis = self._outcome(reader, outcome, reason, rc)
        return self._report(status, rc, error, diagnosis, early=bool(outcome))

    def _outcome(self, reader, outcome: str | None, reason: str,
                 rc: int) -> tuple[str, str | None, dict | None]:
        reader.join(timeout=10)
        leftovers = kill_run_processes(self.key)
        if leftovers:
            self.say(f"killed leftover processes {leftovers}")
        status = outcome or ("succeeded" if rc == 0 else "failed")
        error = reason if outcome else (None if rc == 0 else self._error_text(rc))
        diagnosis = None
        if status in ("failed", "hung", "timed_out"):
            diagnosis = post_mortem(self.out, status, self.tail)
            if diagnosis and diagnosis.get("sentence"):
                self.say(f"diagnosis: {diagnosis['sentence']}")
                # the culprit's words and traceback first, the ranks that only lost their
                # peer after it, deduplicated (the ranks' own error files, in rank order,
                # would put a victim's "Connection closed by peer" first)
                cause = failure_text(diagnosis) if status == "failed" else None
                error = f"{diagnosis['sentence']}\n\n{cause or error or ''}".rstrip()
        self.say(f"finished: {status} (exit code {rc})")
        return status, error, diagnosis

    def _report(self, status: str, rc: int, error: str | None, diagnosis: dict | None, *,
                early: bool) -> str:
        """Analyse, upload, and report the run's outcome (`early`: a stop someone waits on
        is reported before the partial trace is analysed; the summary follows)."""
        if early:
            # Someone is waiting on this stop (cancel, timeout, shutdown): report it before
            # the partial trace is analysed and uploaded; the summary follows.
            self._finish(status, rc, error, None)
        summary = self._analyze(self._summary())
        tries = attempts(self.out)
        if len(tries) > 1:  # torchrun restarted the job (runtime.max_restarts): each attempt
            summary = {**(summary or {}), "attempts": tries}
            self.say("attempts: " + "; ".join(f"{a['attempt']}: {a['cause'] or 'completed'}"
                                              for a in tries))
        if diagnosis:  # the page leads with it; stacks and tracebacks stay in diagnosis.json
            summary = {**(summary or {}), "diagnosis": {
                k: v for k, v in diagnosis.items() if k not in ("stacks", "errors")}}
        self._upload()
        self.logs.close()
        self._finish(status, rc, error, summary)
        return status

    def _finish(self, status: str, rc: int, error: str | None, summary: dict | None) -> None:
        self.client.finish(self.run_id, status=status, exit_code=rc, error=error,
                           summary=summary,
                           provenance=provenance((summary or {}).get("backend"),
                                                 (summary or {}).get("provenance")))

    def _read(self, proc: subprocess.Popen) -> None:
        for raw in proc.stdout:
            self.output(raw.decode("utf-8", "replace").rstrip("\n"))

    def _supervise(self, proc: subprocess.Popen, timeout: float) -> tuple[str | None, str]:
        start, next_beat = time.monotonic(), 0.0
        local_ranks = int(self.spec["runtime"]["nproc_per_node"])  # started on this host
        while proc.poll() is None:
            now = time.monotonic()
            if now - start > timeout:
                self._stop(proc, f"timeout of {timeout:g} s reached")
                return "timed_out", f"timed out after {timeout:g} s (runtime.timeout_s)"
            if (stalled := self.hang.stalled_s()) is not None and self.hang.hung(
                    stalled, len(rank_pids(self.key)), local_ranks):
                self.say(f"no rank completed a step or a collective for {stalled:.0f} s "
                         "(runtime.hang_timeout_s): dumping every rank's stack")
                asked = dump_stacks(self.key, self.out)
                self.say(f"stacks of {asked} ranks in stack-rank*.txt")
                # A rank blocked inside a collective never runs its Python SIGTERM handler:
                # SIGKILL the ranks now (their flushers wrote traces and flight files up to
                # the last 0.25 s), then stop torchrun as for a timeout.
                for pid in rank_pids(self.key):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                self._stop(proc, "hung")
                return "hung", (f"hung: no progress on any rank for {stalled:.0f} s "
                                "(runtime.hang_timeout_s)")
            if SHUTDOWN.is_set():
                self._stop(proc, "worker shutting down")
                return "failed", "the worker shut down while the run was running"
            if now >= next_beat:
                next_beat = now + self.settings.run_heartbeat_s
                beat = self._beat()
                if beat and beat.get("cancel"):
                    self._stop(proc, "cancel requested")
                    return "cancelled", "cancelled by user"
            wait_exit(proc, 0.1)  # woken by the job's exit: no sleep added to its end
        return None, ""

    def _stop(self, proc: subprocess.Popen, why: str) -> None:
        """SIGTERM to the job's shim: it stops torchrun, and SIGKILLs what is left after the
        grace period. Should the shim itself hang, everything of the run is killed here."""
        self.output.stopping = True
        self.say(f"{why}: stopping the job (SIGTERM to torchrun, SIGKILL after "
                 f"{self.settings.kill_grace_s:g} s)")
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(self.settings.kill_grace_s + 5)
        except subprocess.TimeoutExpired:
            self.say("the job did not stop: SIGKILL to every process of the run")
            proc.kill()
        kill_run_processes(self.key)

    def _error_text(self, rc: int) -> str:
        # a rank that died on a full disk leaves its error file empty (or blank): only the
        # files with words count, else the exit code is all there is
        texts = [t for t in (_read_text(p) for p in sorted(self.out.glob("error-rank*.txt")))
                 if t.strip()]
        if texts:
            heads = [t.strip().split("\n", 1)[0] for t in texts]
            return "\n".join(heads) + "\n\n" + texts[0].strip()[-20000:]
        return f"torchrun exited with code {rc}; see the run's log"

    def _summary(self) -> dict | None:
        path = self.out / "summary.json"
        if not path.is_file():
            return None
        try:
            return json.loads(path.read_text())
        except ValueError as exc:
            self.say(f"summary.json is not valid JSON: {exc}")
            return None

    def _analyze(self, summary: dict | None) -> dict | None:
        """Per-run analysis (torch-free) next to the traces: analysis.json, the Perfetto trace,
        and the headline figures the runs table shows. Partial traces still get analysed."""
        if self.spec.get("kind") == "script":
            return self._analyze_script(summary)
        self._columnar()
        live = self.live.analysis if self.live is not None else None
        if self.spec.get("kind") != "train" or not any(self.out.glob("trace-rank*.jsonl")):
            if live is not None:
                live.discard("no training traces to analyse")
            return summary
        try:
            from jobs.analysis import write_analysis
            t0 = time.monotonic()
            headline = write_analysis(self.out, parse_spec(self.spec, max_world_size=1 << 30),
                                      live=live)
            if live is not None and live.resumed:
                self.say(f"analysis: steps 0-{live.resumed - 1} analysed while the job ran, "
                         f"the rest in {time.monotonic() - t0:.1f} s")
        except Exception as exc:  # noqa: BLE001 - the run's outcome must still be reported
            log.exception("analysis of run %s failed", self.run_id)
            self.say(f"analysis failed: {type(exc).__name__}: {exc}")
            return summary
        return {**(summary or {}), "headline": headline}

    def _analyze_script(self, summary: dict | None) -> dict | None:
        """A script's profiler traces through the import's conversion and the one engine
        (jobs/script_analysis.py); whatever it could not do is said, the outcome still goes."""
        if not any((self.out / "kineto").glob("rank*.json")):
            self.say("no profiler traces to analyse (the script took no optimizer step?)")
            return summary
        try:
            from jobs.script_analysis import analyse_script_run
            headline = analyse_script_run(self.out, self.spec)
        except Exception as exc:  # noqa: BLE001 - the run's outcome must still be reported
            log.exception("analysis of script run %s failed", self.run_id)
            self.say(f"analysis failed: {type(exc).__name__}: {exc}")
            return summary
        return {**(summary or {}), "headline": headline}

    def _columnar(self) -> None:
        """The run's JSON-lines traces into Parquet (jobs/analysis/storage/convert.py), whatever the
        outcome, now that no rank appends to them: what analysis and the Gantt read after.
        A rank the live thread converted while the job ran (LiveConversion) has only its last
        steps left to write."""
        try:
            from jobs.analysis.storage.convert import convert_run_dir
            t0 = time.monotonic()
            convert_run_dir(self.out, live=self.live)
            if self.live is not None and sum(self.live.finished.values()):
                self.say(f"traces in Parquet: {sum(self.live.finished.values()):,} rows of "
                         f"{len(self.live.finished)} rank(s) converted while the job ran, the "
                         f"rest in {time.monotonic() - t0:.1f} s")
        except Exception as exc:  # noqa: BLE001 - analysis falls back to the JSON lines
            log.exception("columnar conversion of run %s failed", self.run_id)
            self.say(f"columnar trace conversion failed: {type(exc).__name__}: {exc}")

    def _upload(self, skip: set[str] | frozenset = frozenset()) -> None:
        """Every file of the run folder, except the relative paths in `skip`, the trace files
        the backend already holds whole (shipped live: each byte crosses the wire once) and
        the half-written files of an atomic write (`*.part`, `*.tmp`: left behind when a write
        failed, e.g. on a full disk; the run's files are the ones they would have replaced)."""
        files = [self.dir / "spec.json", *sorted(
            p for p in self.out.rglob("*") if p.is_file() and p.suffix not in PARTIAL)]
        sealed = []
        for p in files:
            rel = p.relative_to(self.out if p.is_relative_to(self.out) else self.dir)
            if rel.as_posix() in skip:
                continue
            if self._sealed(p, rel.as_posix()):
                sealed.append(rel.as_posix())
                continue
            try:
                self.client.upload(self.run_id, rel.as_posix(), p)
            except Exception as exc:  # noqa: BLE001 - one bad file must not lose the outcome
                self.say(f"upload of {rel} failed: {exc}")
        if sealed:
            self.say(f"{', '.join(sealed)}: shipped live while the job ran, recorded without "
                     "a second upload")


    def _sealed(self, path: Path, rel: str) -> bool:
        """Whether the backend holds this trace file whole already (every byte shipped live
        while the job ran, which has ended): then it is recorded there from its own copy
        instead of uploaded again. Anything else (a chunk lost, a refusal): False, and the
        file is uploaded whole."""
        sent = self.shipped.get(rel)
        try:
            if sent is None or sent != path.stat().st_size:
                return False
            self.client.seal(self.run_id, rel, sent)
            return True
        except Exception:  # noqa: BLE001 - the whole upload is the fallback
            return False


# -- worker lifecycle: shutdown flag and the heartbeat /api/workers shows ------------------------

_hb_stop = threading.Event()


def _worker_heartbeat_loop(settings: Settings, pool: str) -> None:
    client = _client(settings)
    while True:
        with _busy_lock:
            busy = _busy
        try:  # worker_heartbeat never raises; whatever else fails must not end the thread
            client.worker_heartbeat(
                name=worker_name(settings), host=worker_host(settings), queue=settings.queue,
                slots=settings.worker_slots, busy=busy, devices=devices(),
                info={"pid": os.getpid(), "pool": pool, "python": sys.version.split()[0],
                      **({"ranks": settings.worker_ranks} if settings.worker_ranks else {})})
        except Exception:  # noqa: BLE001
            log.warning("worker heartbeat round failed", exc_info=True)
        if _hb_stop.wait(settings.worker_heartbeat_s):
            break
    client.close()


@worker_ready.connect
def _on_ready(sender=None, **_):
    settings = get_settings()
    pool = type(sender.pool).__name__ if sender is not None else "?"
    threading.Thread(target=_worker_heartbeat_loop, args=(settings, pool), daemon=True,
                     name="worker-heartbeat").start()


@worker_shutting_down.connect
def _on_shutting_down(**_):
    SHUTDOWN.set()


@worker_shutdown.connect
def _on_shutdown(**_):
    SHUTDOWN.set()
    _hb_stop.set()
