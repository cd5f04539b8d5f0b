"""Uploaded archives (backend/services/uploads.py): one row per content, keyed by sha256."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from backend.models import Upload, utcnow


def get_upload(db: Session, sha256: str) -> Upload | None:
    return db.get(Upload, sha256)


def uploaded_bytes(db: Session, owner: str) -> int:
    """What `owner`'s uploads weigh in all (their quota counts it)."""
    return int(db.scalar(select(func.coalesce(func.sum(Upload.size), 0))
                         .where(Upload.owner == owner)) or 0)


def create_upload(db: Session, *, sha256: str, size: int, owner: str, name: str, kind: str,
                  file_count: int, unpacked_bytes: int, entries: list[str]) -> tuple[Upload, bool]:
    """(the row, True) when stored now; (the existing row, False) when the same content was
    stored first, by this call's race or before."""
    row = Upload(sha256=sha256, size=size, owner=owner[:100], name=name[:200], kind=kind,
                 file_count=file_count, unpacked_bytes=unpacked_bytes, entries=entries,
                 created_at=utcnow())
    db.add(row)
    try:
        db.commit()
    except IntegrityError:
        db.rollback()
        existing = db.get(Upload, sha256)
        if existing is None:
            raise
        return existing, False
    return row, True
