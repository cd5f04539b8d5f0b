"""The runs the cluster page shows: those holding a worker slot and those waiting for one."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session, defer

from backend.models import Run

# The page shows this many waiting runs; the count of all of them comes with it.
MAX_QUEUED = 500


def running_runs(db: Session) -> list[Run]:
    return list(db.scalars(select(Run).options(defer(Run.summary), defer(Run.provenance))
                           .where(Run.status == "running").order_by(Run.started_at, Run.id)))


def queued_runs(db: Session, limit: int = MAX_QUEUED) -> list[Run]:
    """Oldest first: the order in which a queue's workers take them."""
    return list(db.scalars(select(Run).options(defer(Run.summary), defer(Run.provenance))
                           .where(Run.status == "queued", Run.cancel_requested.is_(False))
                           .order_by(Run.created_at, Run.id).limit(limit)))


def count_queued(db: Session) -> int:
    return db.scalar(select(func.count()).select_from(Run).where(
        Run.status == "queued", Run.cancel_requested.is_(False))) or 0
