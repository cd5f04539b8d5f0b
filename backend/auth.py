"""Accounts: users, personal API tokens, browser sessions, the audit log, and the middleware
that puts an identity on every request (docs/security.md).

Local mode (PARALAB_AUTH unset): one implicit admin `local`, no login. Team mode
(PARALAB_AUTH=required): every /api call needs a session cookie or a bearer API token, except
the public allow-list below; /api/internal/* needs the worker credential instead; every page
without a session redirects to /login.
"""

from __future__ import annotations

import hmac
import logging
from dataclasses import dataclass
from datetime import timedelta
from urllib.parse import quote

from sqlalchemy import delete, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse

from backend.core import security
from backend.core.config import Settings
from backend.core.db import get_sessionmaker
from backend.models import ApiToken, AuditEntry, User, utcnow

log = logging.getLogger(__name__)

# (method, path) pairs any client may call in team mode without credentials.
PUBLIC_API = frozenset({("POST", "/api/auth/login"), ("GET", "/api/health/live")})
INTERNAL_PREFIX = "/api/internal/"
PUBLIC_PAGES = ("/login", "/favicon.ico")
PUBLIC_PAGE_PREFIXES = ("/static/",)
LOCAL_USERNAME = "local"


@dataclass(frozen=True)
class Principal:
    """Who is making a request: what routes, permissions and limits look at."""

    id: int
    username: str
    role: str
    max_concurrent_runs: int | None = None
    max_world_size: int | None = None
    via: str = "local"          # "local", "session" or "token"
    credential_id: int | None = None

    def public(self) -> dict:
        return {"id": self.id, "username": self.username, "role": self.role,
                "max_concurrent_runs": self.max_concurrent_runs,
                "max_world_size": self.max_world_size, "via": self.via}


class AuthError(Exception):
    def __init__(self, status: int, detail: str):
        super().__init__(detail)
        self.status, self.detail = status, detail


def principal_of(user: User, settings: Settings, *, via: str,
                 credential_id: int | None = None) -> Principal:
    mc = user.max_concurrent_runs
    mw = user.max_world_size
    return Principal(
        id=user.id, username=user.username, role=user.role,
        max_concurrent_runs=mc if mc is not None else settings.default_max_concurrent_runs,
        max_world_size=mw if mw is not None else settings.default_user_max_world_size,
        via=via, credential_id=credential_id)


# -- audit -----------------------------------------------------------------------------------------

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


# -- users -----------------------------------------------------------------------------------------

def get_user(db: Session, username: str) -> User | None:
    return db.scalar(select(User).where(User.username == username))


def list_users(db: Session) -> list[User]:
    return list(db.scalars(select(User).where(User.username != LOCAL_USERNAME)
                           .order_by(User.username)))


def create_user(db: Session, settings: Settings, username: str, password: str, *,
                role: str = "member", max_concurrent_runs: int | None = None,
                max_world_size: int | None = None, actor: str = "system",
                client: str | None = None) -> User:
    """ValueError with a message naming the field on any invalid input or a taken name."""
    if err := security.check_username(username):
        raise ValueError(err)
    if role not in security.ROLES:
        raise ValueError(f"role: one of {', '.join(security.ROLES)}")
    if err := security.check_password_policy(settings, password):
        raise ValueError(err)
    user = User(username=username, password_hash=security.hash_password(settings, password),
                role=role, is_active=True, max_concurrent_runs=max_concurrent_runs,
                max_world_size=max_world_size, created_at=utcnow(),
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


# -- credentials -----------------------------------------------------------------------------------

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


def _lookup(db: Session, settings: Settings, raw: str, kind: str) -> Principal | None:
    row = db.scalar(select(ApiToken).where(ApiToken.token_hash == security.token_hash(raw)))
    now = utcnow()
    if row is None or row.kind != kind or row.revoked_at is not None or (
            row.expires_at is not None and row.expires_at <= now):
        return None
    user = db.get(User, row.user_id)
    if user is None or not user.is_active:
        return None
    if row.last_used_at is None or (now - row.last_used_at).total_seconds() >= \
            settings.token_touch_s:
        db.execute(update(ApiToken).where(ApiToken.id == row.id).values(last_used_at=now))
        db.commit()
    return principal_of(user, settings, via="token" if kind == "api" else "session",
                        credential_id=row.id)


def session_from_cookie(db: Session, settings: Settings, cookie: str | None) -> Principal | None:
    raw = security.unsign_cookie(settings.secret_key or "", cookie) if cookie else None
    if not raw or not raw.startswith(security.SESSION_PREFIX):
        return None
    return _lookup(db, settings, raw, "session")


def authenticate(db: Session, settings: Settings, *, authorization: str | None,
                 cookie: str | None, worker_token: str) -> Principal | None:
    """A bearer API token, else a session cookie. A bearer header that is present but not a
    valid user token fails (no fallback to the cookie); the worker credential is refused."""
    if authorization:
        scheme, _, raw = authorization.partition(" ")
        raw = raw.strip()
        if scheme.lower() != "bearer" or not raw:
            raise AuthError(401, "unsupported Authorization header (use: Bearer <token>)")
        if hmac.compare_digest(raw.encode(), worker_token.encode()):
            raise AuthError(401, "the worker credential is only valid on /api/internal")
        if not raw.startswith(security.TOKEN_PREFIX):
            raise AuthError(401, "invalid, expired or revoked token")
        p = _lookup(db, settings, raw, "api")
        if p is None:
            raise AuthError(401, "invalid, expired or revoked token")
        return p
    return session_from_cookie(db, settings, cookie)


def client_address(request: Request) -> str:
    return request.client.host if request.client else "?"


# -- the middleware --------------------------------------------------------------------------------

class AuthMiddleware:
    """Deny by default. Puts `request.state.principal` on every /api request (team mode), checks
    the Origin of cookie-authenticated writes (CSRF), guards /api/internal with the worker
    credential, redirects pages without a session to /login, and adds security headers."""

    def __init__(self, app, settings: Settings):
        self.app = app
        self.settings = settings
        self.team = settings.auth == "required"

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        request = Request(scope)
        path, method = scope["path"], scope["method"]

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                headers = message.setdefault("headers", [])
                names = {k.lower() for k, _ in headers}
                for k, v in ((b"x-content-type-options", b"nosniff"),
                             (b"x-frame-options", b"DENY"),
                             (b"referrer-policy", b"same-origin")):
                    if k not in names:
                        headers.append((k, v))
            await send(message)

        response = await self._check(request, path, method)
        if response is not None:
            return await response(scope, receive, send_with_headers)
        return await self.app(scope, receive, send_with_headers)

    async def _check(self, request: Request, path: str, method: str):
        settings = self.settings
        if path.startswith(INTERNAL_PREFIX) or path == INTERNAL_PREFIX.rstrip("/"):
            expected = request.app.state.worker_token
            auth = request.headers.get("authorization") or ""
            scheme, _, raw = auth.partition(" ")
            if scheme.lower() != "bearer" or not raw.strip() or not hmac.compare_digest(
                    raw.strip().encode(), expected.encode()):
                return JSONResponse({"detail": "worker credential required"}, 401)
            return None
        cookie = request.cookies.get(security.SESSION_COOKIE)
        unsafe = method in security.UNSAFE_METHODS
        if not self.team:
            # Local mode: no identities, but a foreign web page must not drive the API.
            if unsafe and security.origin_allowed(
                    dict(request.headers), request.url.scheme,
                    settings.trusted_origins) is False:
                return JSONResponse({"detail": "cross-site request refused (Origin)"}, 403)
            return None
        is_api = path == "/api" or path.startswith("/api/")
        if is_api and (method, path) in PUBLIC_API:
            return None
        if not is_api and (path in PUBLIC_PAGES or path.startswith(PUBLIC_PAGE_PREFIXES)):
            return None
        try:
            principal = await run_in_threadpool(
                self._authenticate, request.headers.get("authorization"), cookie,
                request.app.state.worker_token)
        except AuthError as exc:
            return JSONResponse({"detail": exc.detail}, exc.status,
                                headers={"WWW-Authenticate": "Bearer"})
        if principal is None:
            if is_api or method not in ("GET", "HEAD"):
                return JSONResponse({"detail": "authentication required"}, 401,
                                    headers={"WWW-Authenticate": "Bearer"})
            target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            return RedirectResponse("/login?next=" + quote(safe_next(target), safe=""), 303)
        if principal.via == "session" and unsafe and security.origin_allowed(
                dict(request.headers), request.url.scheme, settings.trusted_origins) is not True:
            return JSONResponse({"detail": "cross-site request refused: a cookie-authenticated "
                                 "write needs a same-origin Origin or Referer header"}, 403)
        request.state.principal = principal
        return None

    def _authenticate(self, authorization, cookie, worker_token) -> Principal | None:
        with get_sessionmaker(self.settings.db_url)() as db:
            return authenticate(db, self.settings, authorization=authorization, cookie=cookie,
                                worker_token=worker_token)


def safe_next(target: str | None) -> str:
    """A local path to go to after login; anything else (other hosts, schemes, `//`, `\\`,
    control characters) becomes "/"."""
    if not target or not target.startswith("/") or target.startswith(("//", "/\\")):
        return "/"
    if any(c in target for c in "\\\r\n\t") or any(ord(c) < 32 for c in target):
        return "/"
    if target.startswith("/login"):
        return "/"
    return target


# -- command line (`paralab users ...`, `paralab token ...`; wired in backend/cli.py) ----------

def _out(text: str, err: bool = False) -> None:
    import sys
    (sys.stderr if err else sys.stdout).write(text + "\n")


def _read_password(from_stdin: bool, prompt: str = "Password: ", confirm: bool = True) -> str:
    import getpass
    import sys
    if from_stdin:
        return sys.stdin.readline().rstrip("\r\n")
    pw = getpass.getpass(prompt)
    if confirm and getpass.getpass("Again: ") != pw:
        raise ValueError("passwords do not match")
    return pw


def cli_users(a) -> int:
    """Operator commands on the backend host's database (PARALAB_* / DATABASE_URL)."""
    from backend.core.config import get_settings
    settings = get_settings()
    with get_sessionmaker(settings.db_url)() as db:
        if a.users_cmd == "create":
            role = "admin" if a.admin else a.role
            pw = _read_password(a.password_stdin)
            user = create_user(db, settings, a.name, pw, role=role, actor="cli")
            _out(f"created {user.username} ({user.role})")
            return 0
        if a.users_cmd == "list":
            for u in list_users(db):
                limits = f"runs<={u.max_concurrent_runs} world<={u.max_world_size}"
                _out(f"{u.username:20} {u.role:7} {'active' if u.is_active else 'disabled':8} "
                      f"{limits}")
            return 0
        user = get_user(db, a.name)
        if user is None or user.username == LOCAL_USERNAME:
            raise ValueError(f"no user {a.name!r}")
        changes: dict = {}
        if a.role:
            changes["role"] = a.role
        if a.max_concurrent_runs is not None:
            changes["max_concurrent_runs"] = a.max_concurrent_runs if \
                a.max_concurrent_runs >= 0 else None
        if a.max_world_size is not None:
            changes["max_world_size"] = a.max_world_size if a.max_world_size > 0 else None
        if a.active:
            changes["is_active"] = a.active == "yes"
        if changes:
            update_user(db, user, changes, actor="cli")
        if a.password_stdin:
            set_password(db, settings, user, _read_password(True), actor="cli")
        _out(f"updated {user.username} ({user.role}, "
              f"{'active' if user.is_active else 'disabled'})")
        return 0


def cli_token(a, url: str, headers: dict, error_cls) -> int:
    """Personal API tokens over HTTP. Authenticates with PARALAB_TOKEN, or with --user and a
    password (a short-lived session; the CLI sends the Origin header a browser would)."""
    import json

    import httpx
    with httpx.Client(base_url=url, timeout=30, headers=headers) as http:
        try:
            if a.user:
                pw = _read_password(a.password_stdin, f"Password for {a.user}: ",
                                    confirm=False)
                r = http.post("/api/auth/login", json={"username": a.user, "password": pw},
                              headers={"Origin": url})
                if r.status_code != 200:
                    raise error_cls(f"login failed ({r.status_code}): {r.json().get('detail')}")
                http.headers.pop("Authorization", None)
                http.headers["Origin"] = url
            if a.token_cmd == "create":
                body = {"name": a.name, **({"expires_days": a.expires_days}
                                           if a.expires_days else {})}
                r = http.post("/api/auth/tokens", json=body)
            elif a.token_cmd == "list":
                r = http.get("/api/auth/tokens")
            else:
                r = http.delete(f"/api/auth/tokens/{a.id}")
            if a.user:
                http.post("/api/auth/logout")
        except httpx.TransportError as exc:
            raise error_cls(f"cannot reach paralab at {url} ({exc})", 3) from exc
    if r.status_code >= 400:
        try:
            detail = r.json().get("detail")
        except ValueError:
            detail = r.text
        raise error_cls(f"error {r.status_code}: {detail}")
    if a.token_cmd == "revoke":
        _out(f"revoked token {a.id}")
        return 0
    out = r.json()
    if a.json:
        _out(json.dumps(out, indent=1))
    elif a.token_cmd == "create":
        _out(out["token"])
        _out(f"token {out['id']} ({out['prefix']}...): shown once; export PARALAB_TOKEN=...",
             err=True)
    else:
        for t in out:
            state = "revoked" if t["revoked_at"] else "active"
            _out(f"{t['id']:>5}  {t['prefix']}...  {t['name']:20} {state:8} "
                  f"last used {t['last_used_at'] or 'never'}")
    return 0
