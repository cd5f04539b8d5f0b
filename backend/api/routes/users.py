"""Users (admin only): create, list, change role / limits / active, reset a password, and see
or revoke anyone's API tokens. Every change is in the audit log. A user's limits and where
they stand (backend/quotas.py): their own, or anyone's for an admin."""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from backend import crud, permissions, quotas
from backend.api.deps import CheckedParams, DbDep, SettingsDep, UserDep
from backend.api.routes.auth import TokenOut
from backend.api.schemas import INT32_MAX, Input, SafeStr
from backend.core import identity
from backend.core.identity import principal_of
from backend.errors import Conflict, Invalid, NotFound
from backend.models import User

router = APIRouter(prefix="/api/users", tags=["accounts"], dependencies=[CheckedParams])


class UserOut(BaseModel):
    username: str
    role: str
    is_active: bool
    max_concurrent_runs: int | None
    max_world_size: int | None
    max_slot_hours: float | None
    created_at: datetime

    @classmethod
    def of(cls, u: User) -> UserOut:
        return cls(username=u.username, role=u.role, is_active=u.is_active,
                   max_concurrent_runs=u.max_concurrent_runs, max_world_size=u.max_world_size,
                   max_slot_hours=u.max_slot_hours, created_at=u.created_at)


class UserIn(Input):
    model_config = ConfigDict(extra="forbid")
    username: SafeStr = Field(min_length=1, max_length=64)
    password: str = Field(min_length=1, max_length=1024)  # hashed, never stored: any text
    role: str = Field("member", pattern="^(viewer|member|admin)$")
    max_concurrent_runs: int | None = Field(None, ge=0, le=INT32_MAX)
    max_world_size: int | None = Field(None, ge=1, le=INT32_MAX)
    max_slot_hours: float | None = Field(None, ge=0, le=1e9, allow_inf_nan=False)


class UserPatch(Input):
    model_config = ConfigDict(extra="forbid")
    role: str | None = Field(None, pattern="^(viewer|member|admin)$")
    is_active: bool | None = None
    max_concurrent_runs: int | None = Field(None, ge=0, le=INT32_MAX)
    max_world_size: int | None = Field(None, ge=1, le=INT32_MAX)
    # world size x hours over PARALAB_QUOTA_WINDOW_S (null: PARALAB_DEFAULT_MAX_SLOT_HOURS)
    max_slot_hours: float | None = Field(None, ge=0, le=1e9, allow_inf_nan=False)
    password: str | None = Field(None, min_length=1, max_length=1024)  # hashed


def _user_or_404(db, username: str) -> User:
    user = crud.get_user(db, username)
    if user is None or user.username == crud.LOCAL_USERNAME:
        raise NotFound(f"no user {username!r}")
    return user


@router.get("", response_model=list[UserOut])
def list_users(db: DbDep, user: UserDep) -> list[UserOut]:
    permissions.require_admin(user, "listing users")
    return [UserOut.of(u) for u in crud.list_users(db)]


@router.post("", status_code=201, response_model=UserOut)
def create_user(request: Request, db: DbDep, settings: SettingsDep, user: UserDep,
                body: UserIn) -> UserOut:
    permissions.require_admin(user, "creating users")
    try:
        new = crud.create_user(db, settings, body.username, body.password, role=body.role,
                               max_concurrent_runs=body.max_concurrent_runs,
                               max_world_size=body.max_world_size,
                               max_slot_hours=body.max_slot_hours, actor=user.username,
                               client=identity.client_address(request))
    except ValueError as exc:
        raise Invalid(str(exc)) from exc
    return UserOut.of(new)


@router.get("/{username}", response_model=UserOut)
def get_user(db: DbDep, user: UserDep, username: str) -> UserOut:
    if username != user.username:
        permissions.require_admin(user, "reading other users")
    return UserOut.of(_user_or_404(db, username))


class LimitsOut(BaseModel):
    """What binds the user at submit and where they stand (docs/security.md "Quotas"); null:
    no limit. `settings` names the environment variable that sets each server-wide value."""
    username: str
    mode: str
    max_world_size: int
    max_concurrent_runs: int | None
    active_runs: int
    max_slot_hours: float | None
    window_s: float
    slot_hours_used: float
    slot_hours_reserved: float
    max_timeout_s: float | None
    min_hang_timeout_s: float | None
    bounds_exempt: bool
    settings: dict[str, str]


@router.get("/{username}/limits", response_model=LimitsOut)
def user_limits(db: DbDep, settings: SettingsDep, user: UserDep, username: str) -> LimitsOut:
    """Your limits and usage (the new-run form shows them); an admin's, anyone's."""
    if username == user.username:
        return LimitsOut(**quotas.limits(db, settings, user))
    permissions.require_admin(user, "reading other users' limits")
    target = principal_of(_user_or_404(db, username), settings, via="token")
    return LimitsOut(**quotas.limits(db, settings, target))


@router.patch("/{username}", response_model=UserOut)
def update_user(request: Request, db: DbDep, settings: SettingsDep, user: UserDep,
                username: str, body: UserPatch) -> UserOut:
    """Role, limits (null in the body clears a limit), active flag, password reset."""
    permissions.require_admin(user, "changing users")
    target = _user_or_404(db, username)
    changes = body.model_dump(exclude_unset=True)
    password = changes.pop("password", None)
    for k in ("role", "is_active"):
        if k in changes and changes[k] is None:
            changes.pop(k)
    if target.username == user.username and (changes.get("role", "admin") != "admin"
                                              or changes.get("is_active") is False):
        raise Conflict("an admin cannot demote or deactivate themselves")
    client = identity.client_address(request)
    try:
        if changes:
            crud.update_user(db, target, changes, actor=user.username, client=client)
        if password is not None:
            crud.set_password(db, settings, target, password, actor=user.username,
                              client=client)
    except ValueError as exc:
        raise Invalid(str(exc)) from exc
    return UserOut.of(target)


@router.get("/{username}/tokens", response_model=list[TokenOut])
def user_tokens(db: DbDep, user: UserDep, username: str) -> list[TokenOut]:
    permissions.require_admin(user, "listing other users' tokens")
    target = _user_or_404(db, username)
    return [TokenOut.of(t, target.username) for t in crud.list_tokens(db, target.id)]
