"""Collective bandwidth sweeps and compute-rate calibrations: the one "latest" rule (per job
kind), and the sweep list."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.crud.runs import RunFilter, get_run, list_runs
from backend.models import Run


def _latest(db: Session, kind: str, queue: str, exclude: str | None) -> Run | None:
    q = (select(Run).where(Run.kind == kind, Run.status == "succeeded", Run.queue == queue)
         .order_by(Run.created_at.desc()).limit(20))
    if exclude is not None:
        q = q.where(Run.id != exclude)
    return next((r for r in db.scalars(q) if (r.summary or {}).get("results")), None)


def latest_sweep(db: Session, queue: str, *, exclude: str | None = None) -> Run | None:
    """The one "latest sweep" rule: the newest succeeded collective bandwidth sweep with results
    on the same worker queue (one queue per host pool), so a run is compared with a sweep of
    its own hosts, never with another pool's."""
    return _latest(db, "collective_bench", queue, exclude)


def latest_compute_calibration(db: Session, queue: str, *,
                               exclude: str | None = None) -> Run | None:
    """The same rule for compute-rate calibrations (job kind compute_bench): the newest
    succeeded one with results on the queue, the FLOP/s of that queue's devices."""
    return _latest(db, "compute_bench", queue, exclude)


def collective_sweeps(db: Session, ids: list[str] | None, *, limit: int = 20) -> list[Run]:
    """The given sweep runs (unknown IDs left out), else the latest succeeded ones; only those
    with a summary."""
    if ids:
        runs = [r for r in (get_run(db, i) for i in ids[:20]) if r is not None]
    else:
        runs, _ = list_runs(db, RunFilter(status="succeeded", strategy="collective-sweep"),
                            limit=limit)
    return [r for r in runs if isinstance(r.summary, dict)]
