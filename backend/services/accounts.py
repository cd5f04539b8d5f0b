"""Accounts: password login and password change (docs/security.md). Raise domain errors."""

from __future__ import annotations

from sqlalchemy.orm import Session

from backend import crud
from backend.core import security
from backend.core.config import Settings
from backend.errors import Forbidden, Invalid, Unauthorized
from backend.models import User

LOGIN_FAILED = "invalid username or password"


def check_login(db: Session, settings: Settings, username: str, password: str, *,
                client: str) -> tuple[str, User]:
    """A new browser session (the raw token, for the cookie) and its user, or Unauthorized with
    the same message whether or not the user exists (an unknown user costs a hash too)."""
    name = username.strip().lower()
    user = crud.get_user(db, name)
    usable = user is not None and user.is_active and user.password_hash.startswith("$")
    if not security.verify_password(settings, user.password_hash if usable else None, password):
        # The entry names what was typed, never whether such a user exists.
        crud.audit(db, "anonymous", "auth.login_failed", None, {"username": username[:100]},
                   client)
        raise Unauthorized(LOGIN_FAILED, headers={})
    if security.needs_rehash(settings, user.password_hash):
        user.password_hash = security.hash_password(settings, password)
    raw, _ = crud.create_credential(db, user, kind="session", name=f"session {client}",
                                    ttl_s=settings.session_ttl_s)
    return raw, user


def change_password(db: Session, settings: Settings, user_id: int, current: str, new: str, *,
                    actor: str, client: str | None = None) -> None:
    """The user's own change: the current password must match (Forbidden; local mode has no
    passwords), the new one must pass the policy (Invalid naming new_password). Every session
    of the user ends, API tokens stay (crud.set_password)."""
    row = db.get(User, user_id)
    if settings.auth != "required" or row is None or not security.verify_password(
            settings, row.password_hash if row.password_hash.startswith("$") else None,
            current):
        raise Forbidden("current password does not match")
    try:
        crud.set_password(db, settings, row, new, actor=actor, client=client)
    except ValueError as exc:
        raise Invalid(str(exc), field="new_password") from exc
