"""The audit log: who did what to which run, user or token, and failed logins."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.models import AuditEntry, utcnow


def audit(db: Session, actor: str, action: str, target: str | None = None,
          detail: dict | None = None, client: str | None = None, *, commit: bool = True) -> None:
    db.add(AuditEntry(ts=utcnow(), actor=actor[:100], action=action,
                      target=target[:200] if target else None, detail=detail,
                      client=(client or "")[:100] or None))
    if commit:
        db.commit()


def list_audit(db: Session, *, action: str | None = None, actor: str | None = None,
               before_id: int | None = None, limit: int = 100) -> list[AuditEntry]:
    stmt = select(AuditEntry)
    if action:
        stmt = stmt.where(AuditEntry.action.in_(action.split(",")))
    if actor:
        stmt = stmt.where(AuditEntry.actor == actor)
    if before_id is not None:
        stmt = stmt.where(AuditEntry.id < before_id)
    return list(db.scalars(stmt.order_by(AuditEntry.id.desc()).limit(limit)))
