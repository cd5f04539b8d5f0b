"""Login, logout, who am I, personal API tokens, own password. The /login page is in
routes/pages.py."""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter, Path, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from backend import crud, permissions, services
from backend.api.deps import CheckedParams, DbDep, SettingsDep, UserDep
from backend.api.schemas import INT32_MAX, Input, SafeStr
from backend.core import identity, security
from backend.core.db import get_sessionmaker
from backend.errors import (
    Forbidden,
    MethodNotAllowed,
    NotFound,
    TooManyAttempts,
    Unauthorized,
)
from backend.models import ApiToken, User

router = APIRouter(prefix="/api/auth", tags=["accounts"], dependencies=[CheckedParams])


class LoginIn(Input):
    model_config = ConfigDict(extra="forbid")
    username: SafeStr = Field(min_length=1, max_length=200)
    password: str = Field(min_length=1, max_length=1024)  # hashed, never stored: any text
    next: SafeStr | None = Field(None, max_length=2000)


class TokenIn(Input):
    model_config = ConfigDict(extra="forbid")
    name: SafeStr = Field(min_length=1, max_length=100)
    expires_days: float | None = Field(None, gt=0, le=3650)


class TokenOut(BaseModel):
    id: int
    name: str
    prefix: str
    created_at: datetime
    last_used_at: datetime | None
    expires_at: datetime | None
    revoked_at: datetime | None
    username: str | None = None

    @classmethod
    def of(cls, row: ApiToken, username: str | None = None) -> TokenOut:
        return cls(id=row.id, name=row.name, prefix=row.prefix, created_at=row.created_at,
                   last_used_at=row.last_used_at, expires_at=row.expires_at,
                   revoked_at=row.revoked_at, username=username)


class NewTokenOut(TokenOut):
    token: str = Field(description="shown once; store it now (e.g. PARALAB_TOKEN)")


class PasswordIn(Input):
    model_config = ConfigDict(extra="forbid")
    current_password: str = Field(min_length=1, max_length=1024)  # hashed, never stored
    new_password: str = Field(min_length=1, max_length=1024)


def _cookie_secure(request: Request, settings) -> bool:
    if settings.cookie_secure is not None:
        return settings.cookie_secure
    return request.url.scheme == "https"


@router.post("/login")
async def login(request: Request, body: LoginIn, settings: SettingsDep) -> JSONResponse:
    """Start a browser session (HttpOnly, SameSite=Strict cookie). Failures say the same thing
    whether or not the user exists; repeated failures per username or address are throttled."""
    if settings.auth != "required":
        return JSONResponse({"username": crud.LOCAL_USERNAME, "role": "admin", "mode": "local",
                             "next": identity.safe_next(body.next)})
    if security.origin_allowed(dict(request.headers), request.url.scheme,
                               settings.trusted_origins) is False:
        raise Forbidden("cross-site login refused (Origin)")
    throttles: dict[str, security.LoginThrottle] = request.app.state.login_throttle
    client = identity.client_address(request)
    keys = {"user": body.username.strip().lower(), "addr": client}
    wait = max(t.retry_after([keys[k]]) for k, t in throttles.items())
    if wait > 0:
        raise TooManyAttempts("too many failed logins; try again later", retry_after_s=wait)
    try:
        raw, user = await run_in_threadpool(_check_login, settings, body, client)
    except Unauthorized:
        for k, t in throttles.items():
            t.failed([keys[k]])
        raise
    throttles["user"].succeeded([keys["user"]])
    resp = JSONResponse({"username": user.username, "role": user.role, "mode": "team",
                         "next": identity.safe_next(body.next)})
    resp.set_cookie(security.SESSION_COOKIE, security.sign_cookie(settings.secret_key, raw),
                    max_age=int(settings.session_ttl_s), path="/", httponly=True,
                    samesite="strict", secure=_cookie_secure(request, settings))
    return resp


@router.get("/login", include_in_schema=False)
def login_get() -> None:
    """Without this, the catch-all /api 404 would answer: the path exists, for POST only."""
    raise MethodNotAllowed("use POST /api/auth/login with a JSON body {username, password} "
                           "(the login page is GET /login)", allow=["POST"])


def _check_login(settings, body: LoginIn, client: str) -> tuple[str, User]:
    with get_sessionmaker(settings.db_url)() as db:
        return services.check_login(db, settings, body.username, body.password, client=client)


@router.post("/logout", status_code=204)
def logout(request: Request, db: DbDep, settings: SettingsDep, user: UserDep) -> Response:
    """End this browser session (the server forgets it; the cookie is cleared)."""
    if user.via == "session" and user.credential_id is not None:
        row = db.get(ApiToken, user.credential_id)
        if row is not None:
            crud.revoke_credential(db, row)
    resp = Response(status_code=204)
    resp.delete_cookie(security.SESSION_COOKIE, path="/", httponly=True, samesite="strict",
                       secure=_cookie_secure(request, settings))
    return resp


@router.get("/me")
def me(user: UserDep, settings: SettingsDep) -> dict:
    """The caller: username, role, per-user limits, and what the role allows."""
    return {**user.public(), "mode": "team" if settings.auth == "required" else "local",
            "can_submit": permissions.can_submit(user),
            "is_admin": permissions.at_least(user, "admin")}


@router.post("/password", status_code=204)
def change_password(request: Request, db: DbDep, settings: SettingsDep, user: UserDep,
                    body: PasswordIn) -> Response:
    """Change your own password: the current one is required; every session of yours ends
    (this one too), your API tokens stay (docs/security.md)."""
    services.change_password(db, settings, user.id, body.current_password, body.new_password,
                             actor=user.username, client=identity.client_address(request))
    return Response(status_code=204)


@router.get("/tokens", response_model=list[TokenOut])
def list_tokens(db: DbDep, user: UserDep) -> list[TokenOut]:
    """Your personal API tokens (never the tokens themselves: only their prefix)."""
    return [TokenOut.of(t) for t in crud.list_tokens(db, user.id)]


@router.post("/tokens", status_code=201, response_model=NewTokenOut)
def create_token(request: Request, db: DbDep, user: UserDep, body: TokenIn) -> NewTokenOut:
    """A personal API token for the CLI and scripts (`Authorization: Bearer <token>`), with
    your role. It is shown in this response only."""
    row_user = db.get(User, user.id)
    ttl = body.expires_days * 86400 if body.expires_days else None
    raw, row = crud.create_credential(db, row_user, kind="api", name=body.name, ttl_s=ttl)
    crud.audit(db, user.username, "token.create", f"token {row.id}",
               {"name": row.name, "prefix": row.prefix}, identity.client_address(request))
    return NewTokenOut(**TokenOut.of(row).model_dump(), token=raw)


@router.delete("/tokens/{token_id}", status_code=204)
def revoke_token(request: Request, db: DbDep, user: UserDep,
                 token_id: int = Path(ge=0, le=INT32_MAX)) -> Response:
    """Revoke a token at once. Your own; admins may revoke anyone's."""
    row = db.get(ApiToken, token_id)
    if row is None or row.kind != "api" or (
            row.user_id != user.id and not permissions.at_least(user, "admin")):
        raise NotFound(f"no token {token_id}")
    crud.revoke_credential(db, row)
    crud.audit(db, user.username, "token.revoke", f"token {row.id}",
               {"name": row.name, "prefix": row.prefix, "user_id": row.user_id},
               identity.client_address(request))
    return Response(status_code=204)
