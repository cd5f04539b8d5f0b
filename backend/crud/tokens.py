"""Credentials: personal API tokens and browser sessions (both rows of api_tokens; only the
SHA-256 of a token is stored)."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import delete, or_, select, update
from sqlalchemy.orm import Session

from backend.core import security
from backend.models import ApiToken, User, utcnow


def create_credential(db: Session, user: User, *, kind: str, name: str,
                      ttl_s: float | None) -> tuple[str, ApiToken]:
    """A new random token; the caller shows it once. Only its SHA-256 is stored."""
    raw = security.new_token(security.TOKEN_PREFIX if kind == "api" else security.SESSION_PREFIX)
    if kind == "session":  # forget this user's ended sessions
        now = utcnow()
        db.execute(delete(ApiToken).where(
            ApiToken.user_id == user.id, ApiToken.kind == "session",
            or_(ApiToken.revoked_at.is_not(None), ApiToken.expires_at <= now)))
    row = ApiToken(user_id=user.id, kind=kind, name=name[:100],
                   prefix=security.display_prefix(raw), token_hash=security.token_hash(raw),
                   created_at=utcnow(),
                   expires_at=utcnow() + timedelta(seconds=ttl_s) if ttl_s else None)
    db.add(row)
    db.commit()
    return raw, row


def list_tokens(db: Session, user_id: int | None = None) -> list[ApiToken]:
    stmt = select(ApiToken).where(ApiToken.kind == "api")
    if user_id is not None:
        stmt = stmt.where(ApiToken.user_id == user_id)
    return list(db.scalars(stmt.order_by(ApiToken.id)))


def revoke_credential(db: Session, row: ApiToken) -> None:
    if row.revoked_at is None:
        row.revoked_at = utcnow()
    db.commit()


def lookup_credential(db: Session, raw: str, kind: str, *,
                      touch_s: float) -> tuple[ApiToken, User] | None:
    """The live credential of this kind and its active user, or None (unknown, wrong kind,
    revoked, expired, user deactivated). Records last use at most every `touch_s` seconds."""
    row = db.scalar(select(ApiToken).where(ApiToken.token_hash == security.token_hash(raw)))
    now = utcnow()
    if row is None or row.kind != kind or row.revoked_at is not None or (
            row.expires_at is not None and row.expires_at <= now):
        return None
    user = db.get(User, row.user_id)
    if user is None or not user.is_active:
        return None
    if row.last_used_at is None or (now - row.last_used_at).total_seconds() >= touch_s:
        db.execute(update(ApiToken).where(ApiToken.id == row.id).values(last_used_at=now))
        db.commit()
    return row, user
