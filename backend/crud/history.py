"""The shared history around runs: a user's stars and saved comparisons."""

from __future__ import annotations

import secrets

from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.errors import NotFound
from backend.models import Run, SavedComparison, Star


def starred_ids(db: Session, user_id: int, run_ids: list[str]) -> set[str]:
    """Which of these runs the user starred (one query for a whole page of runs)."""
    if not run_ids:
        return set()
    return set(db.scalars(select(Star.run_id).where(Star.user_id == user_id,
                                                    Star.run_id.in_(run_ids))))


def stars_of(db: Session, user_id: int) -> list[str]:
    return list(db.scalars(select(Star.run_id).where(Star.user_id == user_id)
                           .order_by(Star.created_at.desc())))


def set_star(db: Session, user_id: int, run_id: str, starred: bool) -> None:
    """Idempotent both ways."""
    star = db.get(Star, (user_id, run_id))
    if starred and star is None:
        db.add(Star(user_id=user_id, run_id=run_id))
    elif not starred and star is not None:
        db.delete(star)
    db.commit()


def create_comparison(db: Session, *, name: str, owner: str,
                      run_ids: list[str]) -> SavedComparison:
    found = set(db.scalars(select(Run.id).where(Run.id.in_(run_ids))))
    missing = [x for x in run_ids if x not in found]
    if missing:
        # the body is well-formed; what it names does not exist: 404, as for a missing run
        raise NotFound(f"no such runs: {', '.join(missing)}")
    c = SavedComparison(id=secrets.token_hex(8), name=name, owner=owner, run_ids=run_ids)
    db.add(c)
    db.commit()
    return c


def list_comparisons(db: Session, *, owner: str | None = None,
                     limit: int = 100) -> list[SavedComparison]:
    stmt = select(SavedComparison)
    if owner:
        stmt = stmt.where(SavedComparison.owner == owner)
    return list(db.scalars(stmt.order_by(SavedComparison.created_at.desc()).limit(limit)))


def get_comparison(db: Session, comparison_id: str) -> SavedComparison:
    c = db.get(SavedComparison, comparison_id)
    if c is None:
        raise NotFound(f"no saved comparison {comparison_id!r}")
    return c


def delete_comparison(db: Session, c: SavedComparison) -> None:
    db.delete(c)
    db.commit()
