"""Per-user rate limits on the requests whose cost grows with the request (issue 36;
docs/security.md "Limits"): POST /api/advise (`advise`), POST /api/predict and
GET /api/schedules/explore (`compute`). Each is a sliding window per user (the login
throttle's, backend/core/security.py) of settings.rate_limit_<kind> requests per
settings.rate_limit_window_s; over it the answer is 429 with Retry-After and the limit named.

A request is counted once its input has passed the rules (a 422 for a field costs nothing
and is not counted); one refused by the advisor's search budget was counted. In memory, per
API process: one process serves the API (docs/security.md)."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

from backend.core.security import LoginThrottle
from backend.errors import Invalid, TooManyAttempts

KINDS = {"advise": "POST /api/advise",
         "compute": "POST /api/predict and GET /api/schedules/explore"}
_MAKE = threading.Lock()


class RequestLimit(LoginThrottle):
    """A sliding window of requests per key: `take` counts one unless the window is full."""

    def take(self, key: str) -> float:
        """0 when the request is counted now, else the seconds until one would be."""
        now = self.clock()
        with self._lock:
            q = self._prune(key, now)
            if len(q) >= self.max_failures:
                return self.window_s - (now - q[0])
            self._fails.setdefault(key, q).append(now)
            return 0.0

    def give_back(self, key: str) -> None:
        """Uncount the newest request of `key` (it was refused for its input)."""
        with self._lock:
            q = self._fails.get(key)
            if q:
                q.pop()


class RequestLimits:
    def __init__(self, settings, clock=time.monotonic):
        self.window_s = settings.rate_limit_window_s
        self.limits = {kind: RequestLimit(getattr(settings, f"rate_limit_{kind}"),
                                          self.window_s, clock) for kind in KINDS}

    def charge(self, kind: str, user: str) -> None:
        """Count one `kind` request of `user`, or raise 429 naming the limit."""
        lim = self.limits[kind]
        wait = lim.take(user)
        if wait > 0:
            raise TooManyAttempts(
                f"rate limit: at most {lim.max_failures} {KINDS[kind]} requests per "
                f"{self.window_s:g} s per user (PARALAB_RATE_LIMIT_{kind.upper()}); try again "
                f"in {wait:.0f} s", retry_after_s=wait)

    @contextmanager
    def counted(self, kind: str, user: str):
        """Count the request; uncount it if it turns out to be a 422 for its input."""
        self.charge(kind, user)
        try:
            yield
        except Invalid:
            self.limits[kind].give_back(user)
            raise


def limits_of(app) -> RequestLimits:
    """The app's limits, made on first use from its settings (a test may set
    app.state.request_limits to one with its own clock)."""
    got = getattr(app.state, "request_limits", None)
    if got is None:
        with _MAKE:
            got = getattr(app.state, "request_limits", None)
            if got is None:
                got = app.state.request_limits = RequestLimits(app.state.settings)
    return got

