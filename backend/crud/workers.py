"""Workers as they report in (queue, slots, devices), for health, the form and the memory
gate."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.models import Worker, utcnow


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
