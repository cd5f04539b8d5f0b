"""The middleware that puts an identity on every request (docs/security.md).

Local mode (PARALAB_AUTH unset): one implicit admin `local`, no login. Team mode
(PARALAB_AUTH=required): every /api call needs a session cookie or a bearer API token, except
the public allow-list below; /api/internal/* needs the worker credential instead (a user token
is refused there); every page without a session redirects to /login.
"""

from __future__ import annotations

import hmac
from urllib.parse import quote

from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse

from backend import crud
from backend.core import security
from backend.core.config import Settings
from backend.core.db import get_sessionmaker
from backend.core.identity import Principal, principal_of, safe_next
from backend.errors import Unauthorized

# (method, path) pairs any client may call in team mode without credentials.
PUBLIC_API = frozenset({("POST", "/api/auth/login"), ("GET", "/api/health/live")})
INTERNAL_PREFIX = "/api/internal/"
PUBLIC_PAGES = ("/login", "/favicon.ico")
PUBLIC_PAGE_PREFIXES = ("/static/",)


def _principal(db: Session, settings: Settings, raw: str, kind: str) -> Principal | None:
    found = crud.lookup_credential(db, raw, kind, touch_s=settings.token_touch_s)
    if found is None:
        return None
    row, user = found
    return principal_of(user, settings, via="token" if kind == "api" else "session",
                        credential_id=row.id)


def session_from_cookie(db: Session, settings: Settings, cookie: str | None) -> Principal | None:
    raw = security.unsign_cookie(settings.secret_key or "", cookie) if cookie else None
    if not raw or not raw.startswith(security.SESSION_PREFIX):
        return None
    return _principal(db, settings, raw, "session")


def authenticate(db: Session, settings: Settings, *, authorization: str | None,
                 cookie: str | None, worker_token: str) -> Principal | None:
    """A bearer API token, else a session cookie. A bearer header that is present but not a
    valid user token fails (no fallback to the cookie); the worker credential is refused."""
    if authorization:
        scheme, _, raw = authorization.partition(" ")
        raw = raw.strip()
        if scheme.lower() != "bearer" or not raw:
            raise Unauthorized("unsupported Authorization header (use: Bearer <token>)")
        if hmac.compare_digest(raw.encode(), worker_token.encode()):
            raise Unauthorized("the worker credential is only valid on /api/internal")
        if not raw.startswith(security.TOKEN_PREFIX):
            raise Unauthorized("invalid, expired or revoked token")
        p = _principal(db, settings, raw, "api")
        if p is None:
            raise Unauthorized("invalid, expired or revoked token")
        return p
    return session_from_cookie(db, settings, cookie)


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
        except Unauthorized as exc:  # middleware answers itself: no exception handler here
            return JSONResponse({"detail": exc.detail}, exc.status, headers=exc.headers)
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
