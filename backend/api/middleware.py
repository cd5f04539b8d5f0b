"""The middleware that puts an identity on every request (docs/security.md).

Local mode (PARALAB_AUTH unset): one implicit admin `local`, no login. Team mode
(PARALAB_AUTH=required): every /api call needs a session cookie or a bearer API token, except
the public allow-list below; /api/internal/* needs the worker credential instead (a user token
is refused there); every page without a session redirects to /login. In both modes a request
whose Host is not served here is refused first (DNS rebinding), and so is a write whose Origin
is foreign.
"""

from __future__ import annotations

import hmac
from urllib.parse import quote, urlsplit

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
# Starlette's TestClient calls the app in-process: Host and scope["server"] "testserver",
# client "testclient". Behind uvicorn scope["server"] is always the listening socket's address
# (proxy headers rewrite only the client and the scheme), so no browser can be behind it.
IN_PROCESS = ("testclient", "testserver")


def split_host(value: str) -> tuple[str, int | None] | None:
    """`name[:port]` (an IPv6 address in brackets) -> (lower-case name, port), None if bad."""
    try:
        parts = urlsplit(f"//{value.strip()}")
        port = parts.port
    except ValueError:
        return None
    if not parts.hostname or parts.username is not None or parts.path or parts.query:
        return None
    return parts.hostname.lower(), port


def host_allowed(host: str, allow: tuple[str, ...] | None) -> bool:
    """Is this Host header served? Loopback names always (any port); then each `name` (any
    port) or `name:port` of `allow`; None: any well-formed host."""
    got = split_host(host) if host else None
    if got is None:
        return False
    name, port = got
    if allow is None or security.is_loopback(name):
        return True
    for entry in allow:
        want = split_host(entry)
        if want is not None and want[0] == name and want[1] in (None, port):
            return True
    return False


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
        self.allowed_hosts = settings.host_allow_list

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

    def _host_refused(self, request: Request) -> JSONResponse | None:
        host = request.headers.get("host", "")
        client, server = request.scope.get("client"), request.scope.get("server")
        if (host == IN_PROCESS[1] and client and client[0] == IN_PROCESS[0] and server
                and server[0] == IN_PROCESS[1]):
            return None
        if host_allowed(host, self.allowed_hosts):
            return None
        if self.team:
            why = ("it is not in PARALAB_ALLOWED_HOSTS (nor the host of PARALAB_URL, nor a "
                   "loopback name)")
        else:
            why = ("local mode answers loopback names only (127.0.0.1, localhost, [::1]): a "
                   "web page whose name resolves to this machine must not drive paralab")
        return JSONResponse({"detail": f"Host {host!r} is not served here: {why}; see "
                             "docs/security.md"}, 400)

    async def _check(self, request: Request, path: str, method: str):
        settings = self.settings
        internal = path.startswith(INTERNAL_PREFIX) or path == INTERNAL_PREFIX.rstrip("/")
        # The worker channel is exempt from the Host check: workers may reach the backend by
        # an internal name (http://backend:8000), and the worker credential it needs is
        # nothing a browser holds.
        if not internal and (refused := self._host_refused(request)) is not None:
            return refused
        if internal:
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
            # The Host is a loopback name by now, so a same-origin Origin is one too.
            if unsafe and security.origin_allowed(
                    dict(request.headers), request.url.scheme,
                    settings.trusted_origins) is False:
                source = request.headers.get("origin") or request.headers.get("referer")
                return JSONResponse({"detail": f"cross-site request refused: Origin/Referer "
                                     f"{source!r} is not this server (a web page cannot drive "
                                     "a local paralab; the CLI and scripts send none)"}, 403)
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
