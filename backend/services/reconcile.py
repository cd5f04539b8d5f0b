"""The reconciler: no run waits in "queued" forever.

A message can be lost after the run was stored (the broker's data flushed, the queue's key
deleted), or consumed by a worker that can never claim it (a wrong PARALAB_WORKER_TOKEN: its
claim gets 401 and Celery acknowledges the task). Either way the run would stay queued with
nothing left to start it. So a periodic loop in every API process looks for queued runs whose
message was published more than `queue_claim_timeout_s` ago and

- restarts the clock when every worker slot of the run's queue is busy (the run is simply
  waiting its turn; nothing was lost),
- else publishes the run's message again (same run ID, same task id; the claim is an atomic
  queued -> running, so a run whose first message also arrives is still launched once),
- and after `queue_claim_attempts` publications fails the run with the reason in words.

Several backend processes may run this loop at once: each step is a conditional UPDATE on the
run's `enqueue_attempts` (crud.mark_enqueued / crud.fail_unclaimed), so exactly one process
publishes or fails a given attempt.

Multi-host runs are the placer's (backend/services/placement.py reconcile_nodes, each round):
unclaimed nodes are published again, and a run that no combination of its queue's hosts could
hold for `gang_unplaceable_timeout_s` fails with the reason.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from sqlalchemy.orm import Session

from backend import crud
from backend.core.config import Settings
from backend.core.db import get_sessionmaker
from backend.models import Run, utcnow
from backend.services import placement
from backend.streams import hub
from paralab_core.queue import enqueue_run

log = logging.getLogger(__name__)


def queue_full(db: Session, settings: Settings, queue: str) -> bool:
    """Every slot of the queue's live workers is busy: a queued run waits for one, legitimately.
    No live worker at all is not "full": that is exactly what the bound is for."""
    workers = [w for w in crud.list_workers(db, seen_within_s=settings.worker_alive_s)
               if w.queue == queue]
    return bool(workers) and sum(w.busy for w in workers) >= sum(w.slots for w in workers)


def failure_reason(db: Session, settings: Settings, run: Run) -> str:
    waited = (utcnow() - run.created_at).total_seconds()
    reason = (f"no worker claimed the run after {run.enqueue_attempts} attempts over "
              f"{waited:.0f} s: is a worker running on queue {run.queue!r}, and does its "
              "PARALAB_WORKER_TOKEN match the backend's?")
    refused = crud.list_rejections(db, within_s=max(waited, 60.0))
    if refused:
        names = ", ".join(f"{r.name} (from {r.remote})" for r in refused[:3])
        reason += f" The backend refused the worker credential of: {names}."
    return reason


def reconcile_once(db: Session, settings: Settings,
                   enqueue: Callable[[Settings, str, str], None] = enqueue_run) -> dict:
    """One round. Returns {"requeued": [...], "failed": [...], "waiting": [...]} (run IDs)."""
    out: dict[str, list[str]] = {"requeued": [], "failed": [], "waiting": []}
    full: dict[str, bool] = {}
    for run in crud.unclaimed_runs(db, older_than_s=settings.queue_claim_timeout_s):
        k = run.enqueue_attempts
        if run.queue not in full:
            full[run.queue] = queue_full(db, settings, run.queue)
        if full[run.queue]:
            if crud.mark_enqueued(db, run.id, attempts=k, count=False):
                out["waiting"].append(run.id)
        elif k >= settings.queue_claim_attempts:
            if crud.fail_unclaimed(db, run.id, attempts=k,
                                   error=failure_reason(db, settings, run)):
                out["failed"].append(run.id)
                hub.publish_status(run.id, "failed")
        elif crud.mark_enqueued(db, run.id, attempts=k):
            try:
                enqueue(settings, run.id, run.queue)
            except Exception:  # noqa: BLE001 - the attempt counts; health says the broker is down
                log.warning("re-enqueue of run %s failed", run.id, exc_info=True)
            out["requeued"].append(run.id)
    return out


async def reconciler(settings: Settings) -> None:
    """The loop the API's lifespan starts."""
    maker = get_sessionmaker(settings.db_url)
    interval = min(5.0, settings.queue_claim_timeout_s / 3)

    def round_():
        with maker() as db:
            done = reconcile_once(db, settings)
            # multi-host runs: place, republish, fail those no hosts could hold in the bound
            done["unplaceable"] = placement.reconcile_nodes(db, settings)["unplaceable"]
            for run_id in done["unplaceable"]:
                hub.publish_status(run_id, "failed")
            return done

    while True:
        await asyncio.sleep(interval)
        try:
            done = await asyncio.to_thread(round_)
        except Exception:  # noqa: BLE001 - the next round tries again
            log.exception("reconciler round failed")
            continue
        if done["requeued"]:
            log.warning("queued runs not claimed within %g s, published again: %s",
                        settings.queue_claim_timeout_s, done["requeued"])
        if done["failed"]:
            log.warning("queued runs failed: no worker claimed them after %d attempts: %s",
                        settings.queue_claim_attempts, done["failed"])
        if done["unplaceable"]:
            log.warning("multi-host runs failed: no hosts of their queue could hold them "
                        "within %g s: %s", settings.gang_unplaceable_timeout_s,
                        done["unplaceable"])
