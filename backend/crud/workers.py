"""Workers as they report in (queue, slots, devices), for health, the form and the memory
gate."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from backend.models import Worker, WorkerRejection, utcnow


def upsert_worker(db: Session, *, name: str, host: str, queue: str, slots: int, busy: int,
                  devices: list, info: dict) -> None:
    w = db.get(Worker, name)
    if w is None:
        w = Worker(name=name)
        db.add(w)
    w.host, w.queue, w.slots, w.busy, w.devices, w.info = host, queue, slots, busy, devices, info
    w.last_seen = utcnow()
    db.commit()


def list_workers(db: Session, *, seen_within_s: float) -> list[Worker]:
    since = utcnow() - timedelta(seconds=seen_within_s)
    return list(db.scalars(select(Worker).where(Worker.last_seen >= since)
                           .order_by(Worker.name)))


_MAX_REJECTIONS = 100  # distinct names kept: callers without the credential choose the names


def record_rejection(db: Session, *, name: str, host: str, remote: str) -> None:
    """A call to /api/internal whose worker credential was refused, by the name it gave."""
    now = utcnow()
    db.execute(delete(WorkerRejection).where(WorkerRejection.last_at < now - timedelta(days=1)))
    r = db.get(WorkerRejection, name[:200])
    if r is None:
        if db.scalar(select(func.count()).select_from(WorkerRejection)) >= _MAX_REJECTIONS:
            db.commit()
            return
        r = WorkerRejection(name=name[:200], count=0, first_at=now)
        db.add(r)
    r.host, r.remote, r.last_at = host[:200], remote[:100], now
    r.count += 1
    db.commit()


def list_rejections(db: Session, *, within_s: float) -> list[WorkerRejection]:
    """Refused callers seen within the window, except names that have since reported in with
    the right credential (a worker restarted with the right token)."""
    since = utcnow() - timedelta(seconds=within_s)
    rows = db.scalars(select(WorkerRejection).where(WorkerRejection.last_at >= since)
                      .order_by(WorkerRejection.last_at.desc()))
    out = []
    for r in rows:
        w = db.get(Worker, r.name)
        if w is None or w.last_seen < r.last_at:
            out.append(r)
    return out
