"""Security primitives: password hashing, tokens, signed cookies, origin checks, start-up
checks, login throttling and the rendering of run notes (markdown-it-py + nh3).

No database access here (backend/crud does that); everything is a pure function or a small
in-memory structure, so it can be tested on its own.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
import secrets
import threading
import time
from collections import deque
from functools import lru_cache
from urllib.parse import urlsplit

import nh3
from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError
from markdown_it import MarkdownIt

from backend.core.config import Settings

SESSION_COOKIE = "paralab_session"
TOKEN_PREFIX = "plt_"      # personal API tokens
SESSION_PREFIX = "pls_"    # browser sessions (never shown to anyone)
ROLES = ("viewer", "member", "admin")
USERNAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.\-]{0,63}$")
RESERVED_USERNAMES = frozenset({"local", "worker", "anonymous", "system", "admin-bootstrap"})
WEAK_SECRETS = frozenset({
    "changeme", "change-me", "change_me", "changeit", "secret", "secret-key", "secretkey",
    "dev", "development", "default", "password", "paralab", "test", "testing", "insecure",
    "please-change-me", "your-secret-key", "xxx", "none", "null",
})
MIN_SECRET_LENGTH = 32


class ConfigError(RuntimeError):
    """A setting that makes the service unsafe to start."""


# -- start-up checks ------------------------------------------------------------------------------

def check_secret_key(settings: Settings) -> None:
    """Team mode needs a real secret key: present, not a well-known default, >= 32 chars."""
    if settings.auth != "required":
        return
    key = (settings.secret_key or "").strip()
    if not key:
        raise ConfigError("PARALAB_AUTH=required needs PARALAB_SECRET_KEY "
                          "(e.g. `openssl rand -hex 32`)")
    if key.lower() in WEAK_SECRETS or any(w in key.lower() for w in ("changeme", "change-me")):
        raise ConfigError("PARALAB_SECRET_KEY is a well-known default; generate one with "
                          "`openssl rand -hex 32`")
    if len(key) < MIN_SECRET_LENGTH:
        raise ConfigError(f"PARALAB_SECRET_KEY is too short ({len(key)} characters; at least "
                          f"{MIN_SECRET_LENGTH}); generate one with `openssl rand -hex 32`")
    if len(set(key)) < 8:
        raise ConfigError("PARALAB_SECRET_KEY has too few distinct characters; generate one "
                          "with `openssl rand -hex 32`")


def is_loopback(host: str) -> bool:
    host = host.strip().strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(settings: Settings, host: str) -> None:
    """Local mode (no accounts) only listens on loopback: anyone who can reach the port is the
    admin, so binding 0.0.0.0 or a LAN address needs PARALAB_AUTH=required."""
    if settings.auth != "required" and not is_loopback(host):
        raise ConfigError(f"refusing to listen on {host!r} without accounts: local mode "
                          "(PARALAB_AUTH unset) binds loopback only (127.0.0.1). For a team, "
                          "set PARALAB_AUTH=required and PARALAB_SECRET_KEY (docs/security.md)")


def check_startup(settings: Settings, host: str | None = None) -> None:
    check_secret_key(settings)
    if host is not None:
        check_bind(settings, host)


# -- passwords -------------------------------------------------------------------------------------

@lru_cache
def _hasher(time_cost: int, memory_kib: int, parallelism: int) -> PasswordHasher:
    return PasswordHasher(time_cost=time_cost, memory_cost=memory_kib, parallelism=parallelism)


def password_hasher(settings: Settings) -> PasswordHasher:
    return _hasher(settings.argon2_time_cost, settings.argon2_memory_kib,
                   settings.argon2_parallelism)


def hash_password(settings: Settings, password: str) -> str:
    return password_hasher(settings).hash(password)


def verify_password(settings: Settings, stored: str | None, password: str) -> bool:
    """Constant work whether or not the user exists: an unknown user is checked against a
    dummy hash, so timing does not tell whether a username exists."""
    ph = password_hasher(settings)
    target = stored or _dummy_hash(settings.argon2_time_cost, settings.argon2_memory_kib,
                                   settings.argon2_parallelism)
    try:
        ok = ph.verify(target, password)
    except (VerifyMismatchError, VerificationError, InvalidHashError):
        ok = False
    return ok and stored is not None


def needs_rehash(settings: Settings, stored: str) -> bool:
    try:
        return password_hasher(settings).check_needs_rehash(stored)
    except InvalidHashError:
        return False


@lru_cache
def _dummy_hash(time_cost: int, memory_kib: int, parallelism: int) -> str:
    return _hasher(time_cost, memory_kib, parallelism).hash(secrets.token_urlsafe(16))


def check_password_policy(settings: Settings, password: str) -> str | None:
    """An error message, or None when the password is acceptable."""
    if not isinstance(password, str) or len(password) < settings.password_min_length:
        return f"password: at least {settings.password_min_length} characters"
    if len(password) > 1024:
        return "password: at most 1024 characters"
    return None


def check_username(name: str) -> str | None:
    if not isinstance(name, str) or not USERNAME_RE.match(name):
        return ("username: 1-64 characters, lower-case letters, digits, '_', '-', '.', "
                "starting with a letter or digit")
    if name in RESERVED_USERNAMES:
        return f"username: {name!r} is reserved"
    return None


# -- tokens and cookies ----------------------------------------------------------------------------

def new_token(prefix: str = TOKEN_PREFIX) -> str:
    return prefix + secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    """Tokens carry 256 bits of entropy, so a plain SHA-256 is enough to store them."""
    return hashlib.sha256(token.encode()).hexdigest()


def display_prefix(token: str) -> str:
    return token[:12]


def _mac(secret: str, value: str) -> str:
    return hmac.new(secret.encode(), value.encode(), hashlib.sha256).hexdigest()[:32]


def sign_cookie(secret: str, value: str) -> str:
    return f"{value}.{_mac(secret, value)}"


def unsign_cookie(secret: str, signed: str | None) -> str | None:
    if not signed or "." not in signed:
        return None
    value, _, mac = signed.rpartition(".")
    if not hmac.compare_digest(mac.encode(), _mac(secret, value).encode()):
        return None
    return value


# -- origin check (CSRF) --------------------------------------------------------------------------

UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def _netloc(url: str) -> tuple[str, str] | None:
    try:
        parts = urlsplit(url)
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    try:
        port = parts.port
    except ValueError:
        return None
    port = port or (443 if parts.scheme == "https" else 80)
    return parts.hostname.lower(), str(port)


def _host_header(host: str, scheme: str) -> tuple[str, str] | None:
    return _netloc(f"{scheme}://{host}") if host else None


def origin_allowed(headers: dict[str, str], scheme: str,
                   trusted: list[str] | tuple[str, ...] = ()) -> bool | None:
    """OWASP "verifying origin with standard headers": the Origin (else Referer) of a request
    must name the host the request was sent to. Returns None when neither header is present,
    True / False otherwise ("null" and unparsable values are foreign)."""
    source = headers.get("origin") or headers.get("referer")
    if not source:
        return None
    got = _netloc(source)
    if got is None:
        return False
    host = headers.get("host", "")
    # The Origin's scheme may differ from the request's behind a TLS-terminating proxy; the
    # host and the port the browser used must match the Host header it sent.
    src_scheme = urlsplit(source).scheme
    want = _host_header(host, src_scheme)
    if want is not None and got == want:
        return True
    return any(_netloc(t) == got for t in trusted)


# -- login throttling ------------------------------------------------------------------------------

class LoginThrottle:
    """Failures per key (username, client address) in a sliding window, in memory. One backend
    process serves the API (docs/security.md), so in-memory state is the whole picture."""

    def __init__(self, max_failures: int, window_s: float, clock=time.monotonic):
        self.max_failures, self.window_s, self.clock = max_failures, window_s, clock
        self._fails: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def _prune(self, key: str, now: float) -> deque[float]:
        q = self._fails.get(key)
        if q is None:
            return deque()
        while q and now - q[0] >= self.window_s:
            q.popleft()
        if not q:
            self._fails.pop(key, None)
        return q

    def retry_after(self, keys: list[str]) -> float:
        """Seconds until a new attempt is allowed (0: allowed now)."""
        now = self.clock()
        wait = 0.0
        with self._lock:
            for k in keys:
                q = self._prune(k, now)
                if len(q) >= self.max_failures:
                    wait = max(wait, self.window_s - (now - q[0]))
        return wait

    def failed(self, keys: list[str]) -> None:
        now = self.clock()
        with self._lock:
            for k in keys:
                self._prune(k, now)
                self._fails.setdefault(k, deque()).append(now)
            if len(self._fails) > 100_000:  # bounded memory under a spray of usernames
                for k in list(self._fails)[:50_000]:
                    self._fails.pop(k, None)

    def succeeded(self, keys: list[str]) -> None:
        with self._lock:
            for k in keys:
                self._fails.pop(k, None)


# -- notes: Markdown (markdown-it-py) through an allow-list sanitiser (nh3) ---------------------

NOTE_TAGS = frozenset({"p", "br", "em", "strong", "code", "pre", "a", "ul", "ol", "li",
                       "blockquote", "h1", "h2", "h3", "h4", "h5", "h6", "hr"})
LINK_REL = "nofollow noopener noreferrer"
_SAFE_SCHEMES = ("http://", "https://")
_TAG = re.compile(r"(<[^>]*>)")


@lru_cache(maxsize=1)
def _markdown() -> MarkdownIt:
    # CommonMark without raw HTML (typed tags stay text), newlines kept as <br>, no images
    # (an image would load a third-party URL in the reader's browser).
    md = MarkdownIt("commonmark", {"html": False, "breaks": True}).disable("image")
    # Links only to http(s): anything else (javascript:, data:, mailto:, relative) stays text.
    md.validateLink = lambda url: url.strip().lower().startswith(_SAFE_SCHEMES)
    return md


def render_notes(text: str) -> str:
    """Run notes as HTML: Markdown rendered by markdown-it-py with raw HTML off, then cleaned by
    nh3 (ammonia) to an allow-list of tags, `href` on links only, http/https only, and
    rel="nofollow noopener noreferrer" on every link. Quotes in text are escaped as well, so
    no input can produce a tag, an attribute or a javascript:/data: URL."""
    text = (text or "").replace("\x00", "")
    cleaned = nh3.clean(_markdown().render(text), tags=set(NOTE_TAGS),
                        attributes={"a": {"href"}}, url_schemes={"http", "https"},
                        link_rel=LINK_REL, strip_comments=True)
    # nh3 writes text quotes literally; escape them so the output is inert in any context.
    return "".join(part if part.startswith("<") else
                   part.replace('"', "&quot;").replace("'", "&#x27;")
                   for part in _TAG.split(cleaned)).strip("\n")
