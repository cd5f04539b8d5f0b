"""What /api/health reports beyond "the database and the broker answer": the troubles that
otherwise only show as runs that never start or fail for the wrong reason.

    workers      no worker has reported in: runs wait in the queue
    queue        queued runs no worker claimed within the bound (the reconciler is on them)
    queue_wait   queued runs (one-host or multi-host) that have waited longer than
                 `queue_wait_warn_s`, each with the reason it waits
    worker_auth  callers of /api/internal whose worker credential the backend refused
    disk         free space under the data directory below `disk_min_free_bytes`, or a write
                 that ran out of space recently

Each check is {"ok": bool, ...}; a failed one adds a sentence to the answer's `problems`.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.orm import Session, defer
from starlette.concurrency import run_in_threadpool

from backend import crud, storage
from backend.core.config import Settings
from backend.core.db import get_sessionmaker
from backend.models import Run, utcnow
from backend.services import cluster, placement
from backend.services.reconcile import queue_full

# How long a refused credential or an out-of-space write keeps health degraded.
RECENT_S = 120.0


def _existing(path: Path) -> Path:
    path = Path(path).resolve()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def disk_check(data_dir: Path, min_free_bytes: int,
               usage: Callable = shutil.disk_usage) -> tuple[dict, list[str]]:
    where = _existing(data_dir)
    problems = []
    try:
        free = usage(where).free
    except OSError as exc:
        return {"ok": False, "path": str(where), "error": str(exc)}, [
            f"cannot read the free space of the data directory {where}: {exc}"]
    if free < min_free_bytes:
        problems.append(f"only {free / 1e6:.0f} MB free under the data directory {where} "
                        f"(PARALAB_DISK_MIN_FREE_BYTES is {min_free_bytes / 1e6:.0f} MB): "
                        "runs, logs and uploads will soon fail to be stored")
    failed = storage.recent_failure(RECENT_S)
    if failed:
        problems.append(failed)
    return {"ok": not problems, "path": str(where), "free_bytes": free,
            "min_free_bytes": min_free_bytes, "last_write_error": failed}, problems


def memory_check() -> dict:
    """This API process's resident memory and its trace cache (bytes charged, bound): what
    grows with the runs it serves (backend/services/run_traces.py)."""
    from backend.services import run_traces
    try:
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        rss = None  # not Linux
    return {"ok": True, "pid": os.getpid(), "rss_bytes": rss,
            "trace_cache_bytes": run_traces.cached_bytes(),
            "trace_cache_limit_bytes": run_traces.LIMIT_BYTES}


def worker_checks(db: Session, settings: Settings) -> tuple[dict, list[str]]:
    seen = settings.worker_alive_s
    problems = []
    workers = crud.list_workers(db, seen_within_s=seen)
    checks = {"workers": {"ok": bool(workers), "count": len(workers),
                          "queues": sorted({w.queue for w in workers})}}
    if not workers:
        problems.append(f"no worker has reported in the last {seen:g} s: submitted runs wait "
                        "in the queue until one does")
    bound = settings.queue_claim_timeout_s
    stuck = crud.unclaimed_runs(db, older_than_s=bound)
    # published again at least once: already not claimed within the bound once
    stuck += [r for r in db.scalars(_retried()) if r.id not in {s.id for s in stuck}]
    full = {q: queue_full(db, settings, q) for q in {r.queue for r in stuck}}
    stuck = [r for r in stuck if not full[r.queue]]  # waiting for a busy worker: not stuck
    now = utcnow()
    checks["queue"] = {"ok": not stuck, "claim_timeout_s": bound, "unclaimed": [
        {"id": r.id, "queue": r.queue, "attempts": r.enqueue_attempts,
         "queued_s": round((now - r.created_at).total_seconds(), 1)} for r in stuck[:20]]}
    if stuck:
        queues = ", ".join(sorted({repr(r.queue) for r in stuck}))
        problems.append(f"{len(stuck)} queued run(s) not claimed by any worker within "
                        f"{bound:g} s (queue {queues}); they are published again, then failed "
                        f"after {settings.queue_claim_attempts} attempts")
    refused = crud.list_rejections(db, within_s=RECENT_S)
    checks["worker_auth"] = {"ok": not refused, "rejected": [
        {"name": r.name, "host": r.host, "remote": r.remote, "count": r.count,
         "last_at": r.last_at.isoformat()} for r in refused[:20]]}
    if refused:
        names = ", ".join(f"{r.name} from {r.remote}" for r in refused[:5])
        problems.append(f"the backend refuses the worker credential of {names}: its "
                        "PARALAB_WORKER_TOKEN does not match the backend's, so it takes runs "
                        "it can never claim")
    checks["queue_wait"], said = wait_check(db, settings, workers)
    return checks, problems + said


def _waited_too_long(bound_s: float):
    return select(Run).where(Run.status == "queued", Run.cancel_requested.is_(False),
                             Run.created_at < utcnow() - timedelta(seconds=bound_s))


def _reason(db: Session, settings: Settings, run: Run, stats: dict, waited: float) -> str:
    """The reason the cluster page gives (backend/services/cluster.py, placement.py)."""
    if run.nnodes > 1:
        return placement.why_waiting(db, settings, run) or ""
    ahead = db.scalar(select(func.count()).select_from(Run).where(
        Run.status == "queued", Run.cancel_requested.is_(False), Run.nnodes == 1,
        Run.queue == run.queue, Run.created_at < run.created_at)) or 0
    return cluster.wait_reason(
        stats.get(run.queue) or cluster.QueueStats(run.queue), nnodes=1,
        ranks_per_host=run.world_size, ahead=ahead, waited_s=waited,
        attempts=run.enqueue_attempts, claim_timeout_s=settings.queue_claim_timeout_s,
        claim_attempts=settings.queue_claim_attempts)


def wait_check(db: Session, settings: Settings, workers: list) -> tuple[dict, list[str]]:
    """Degraded while a queued run has waited longer than `queue_wait_warn_s` since it was
    submitted; the 20 oldest are listed with the reason each waits."""
    bound = settings.queue_wait_warn_s
    late = _waited_too_long(bound)
    count = db.scalar(select(func.count()).select_from(late.subquery())) or 0
    now, stats = utcnow(), cluster.queue_stats(workers)
    listed = []
    for r in db.scalars(late.options(defer(Run.summary), defer(Run.provenance))
                        .order_by(Run.created_at, Run.id).limit(20)):
        waited = (now - r.created_at).total_seconds()
        listed.append({"id": r.id, "queue": r.queue, "nnodes": r.nnodes,
                       "queued_s": round(waited, 1),
                       "reason": _reason(db, settings, r, stats, waited)})
    check = {"ok": not count, "warn_s": bound, "count": count, "waiting": listed}
    if not count:
        return check, []
    which = "; ".join(f"{x['id']} ({x['reason']})" for x in listed[:3])
    more = f"; and {count - 3} more" if count > 3 else ""
    return check, [f"{count} queued run(s) waited longer than {bound:g} s "
                   f"(PARALAB_QUEUE_WAIT_WARN_S): {which}{more}"]


def _retried():
    return select(Run).where(Run.status == "queued", Run.enqueue_attempts > 1).limit(20)


# -- refused worker credentials ---------------------------------------------------------------

WORKER_HEADER = "x-paralab-worker"
WORKER_HOST_HEADER = "x-paralab-worker-host"


class _Throttle:
    """At most one record per name a second, so a flood of refused calls costs no more
    database writes than a heartbeat does."""

    def __init__(self, every_s: float = 1.0, keep: int = 1000):
        self.every_s, self.keep, self.last = every_s, keep, {}

    def allow(self, name: str) -> bool:
        now = time.monotonic()
        if now - self.last.get(name, -self.every_s) < self.every_s:
            return False
        if len(self.last) >= self.keep:
            self.last.clear()
        self.last[name] = now
        return True


class RecordRefusedWorkers:
    """ASGI wrapper around the app (outside AuthMiddleware, which answers the 401 itself):
    a 401 on /api/internal/* is recorded with the name the caller gave (the worker client sends
    X-Paralab-Worker), for the worker_auth check above."""

    def __init__(self, app, settings: Settings):
        self.app, self.settings = app, settings
        self.throttle = _Throttle()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope["path"].startswith("/api/internal/"):
            return await self.app(scope, receive, send)
        status = {}

        async def watch(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        await self.app(scope, receive, watch)
        if status.get("code") == 401:
            headers = {k.decode("latin-1").lower(): v.decode("latin-1", "replace")
                       for k, v in scope.get("headers", [])}
            remote = (scope.get("client") or ("?",))[0]
            name = headers.get(WORKER_HEADER) or f"(unnamed caller at {remote})"
            host = headers.get(WORKER_HOST_HEADER) or "?"
            if not self.throttle.allow(name):
                return
            try:
                await run_in_threadpool(self._record, name, host, str(remote))
            except Exception:  # noqa: BLE001 - health's record only; the 401 is already sent
                pass

    def _record(self, name: str, host: str, remote: str) -> None:
        with get_sessionmaker(self.settings.db_url)() as db:
            crud.record_rejection(db, name=name, host=host, remote=remote)
