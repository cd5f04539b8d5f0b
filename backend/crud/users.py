"""Accounts: create, list, update, set a password; the implicit local-mode user. Invalid input
raises ValueError with a message "field: rule" (routes and the CLI turn it into Invalid)."""

from __future__ import annotations

import math

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from backend.core import security
from backend.core.config import Settings
from backend.crud.audit import audit
from backend.models import ApiToken, User, utcnow

LOCAL_USERNAME = "local"


def get_user(db: Session, username: str) -> User | None:
    return db.scalar(select(User).where(User.username == username))


def list_users(db: Session) -> list[User]:
    return list(db.scalars(select(User).where(User.username != LOCAL_USERNAME)
                           .order_by(User.username)))


def create_user(db: Session, settings: Settings, username: str, password: str, *,
                role: str = "member", max_concurrent_runs: int | None = None,
                max_world_size: int | None = None, max_slot_hours: float | None = None,
                actor: str = "system",
                client: str | None = None) -> User:
    """ValueError with a message naming the field on any invalid input or a taken name."""
    if err := security.check_username(username):
        raise ValueError(err)
    if role not in security.ROLES:
        raise ValueError(f"role: one of {', '.join(security.ROLES)}")
    if err := security.check_password_policy(settings, password):
        raise ValueError(err)
    check_slot_hours(max_slot_hours)
    user = User(username=username, password_hash=security.hash_password(settings, password),
                role=role, is_active=True, max_concurrent_runs=max_concurrent_runs,
                max_world_size=max_world_size, max_slot_hours=max_slot_hours,
                created_at=utcnow(),
                password_changed_at=utcnow())
    db.add(user)
    try:
        db.flush()
    except IntegrityError:
        db.rollback()
        raise ValueError(f"username: {username!r} is taken") from None
    audit(db, actor, "user.create", username, {"role": role}, client, commit=False)
    db.commit()
    return user


def check_slot_hours(value: float | None) -> None:
    if value is not None and not (math.isfinite(value) and 0 <= value <= 1e9):
        raise ValueError("max_slot_hours: a number from 0 to 1e9 (null: the server default, "
                         "PARALAB_DEFAULT_MAX_SLOT_HOURS)")


def set_password(db: Session, settings: Settings, user: User, password: str, *,
                 actor: str, client: str | None = None) -> None:
    if err := security.check_password_policy(settings, password):
        raise ValueError(err)
    user.password_hash = security.hash_password(settings, password)
    user.password_changed_at = utcnow()
    # A new password ends every session (but keeps API tokens: they are revoked one by one).
    db.execute(update(ApiToken).where(ApiToken.user_id == user.id, ApiToken.kind == "session",
                                      ApiToken.revoked_at.is_(None)).values(revoked_at=utcnow()))
    audit(db, actor, "user.password", user.username, None, client, commit=False)
    db.commit()


def update_user(db: Session, user: User, changes: dict, *, actor: str,
                client: str | None = None) -> User:
    """role / is_active / limits; deactivation revokes every session and token at once."""
    before = {k: getattr(user, k) for k in changes}
    if "role" in changes and changes["role"] not in security.ROLES:
        raise ValueError(f"role: one of {', '.join(security.ROLES)}")
    check_slot_hours(changes.get("max_slot_hours"))
    for k, v in changes.items():
        setattr(user, k, v)
    if changes.get("is_active") is False:
        db.execute(update(ApiToken).where(ApiToken.user_id == user.id,
                                          ApiToken.revoked_at.is_(None))
                   .values(revoked_at=utcnow()))
    action = "user.role_change" if "role" in changes and before["role"] != changes["role"] \
        else "user.update"
    audit(db, actor, action, user.username, {"before": before, "after": changes}, client,
          commit=False)
    db.commit()
    return user


def local_user(db: Session) -> User:
    """The implicit local-mode user, created on first use (a real row, so stars and tokens
    have someone to belong to). Its password hash "!" matches no password."""
    user = get_user(db, LOCAL_USERNAME)
    if user is None:
        db.add(User(username=LOCAL_USERNAME, password_hash="!", role="admin", is_active=True,
                    created_at=utcnow()))
        try:
            db.commit()
        except IntegrityError:  # another request created it first
            db.rollback()
        user = get_user(db, LOCAL_USERNAME)
    return user
