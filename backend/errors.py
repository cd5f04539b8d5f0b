"""Domain errors: what services, crud and permissions raise instead of HTTP exceptions, so the
same code serves the API (main.py maps each class to one status code) and the command line
(backend/cli prints the message).

    Invalid          422  a field breaks a rule; detail is a list of {loc, msg, type}
    UnsafePath       400  a file path that would leave the run's folder
    Unauthorized     401  no or bad credentials
    Forbidden        403  authenticated, but the role or a limit does not allow it
    NotFound         404  no such run, user, token, comparison, file
    MethodNotAllowed 405  the path exists, not with this method (Allow: says which)
    Conflict         409  the resource's state does not allow it (cancel a finished run)
    TooManyAttempts  429  throttled (failed logins)
    Unavailable      503  a dependency (the broker) is down
    InsufficientStorage 507  a write ran out of space (disk full, quota): what, and where
"""

from __future__ import annotations

from typing import Any


class DomainError(Exception):
    """Base class. `detail` is what the API answers as {"detail": ...}; `headers` travel with
    the response (Retry-After, WWW-Authenticate)."""

    status = 500

    def __init__(self, detail: Any, *, headers: dict[str, str] | None = None):
        super().__init__(detail if isinstance(detail, str) else str(detail))
        self.detail = detail
        self.headers = headers

    def __str__(self) -> str:
        if isinstance(self.detail, list):  # Invalid: one line per field
            return "; ".join(f"{'.'.join(str(p) for p in e.get('loc', []))}: {e.get('msg')}"
                             for e in self.detail)
        return str(self.detail)


class Invalid(DomainError):
    """422, naming the field and the rule: {"detail": [{"loc": [...], "msg", "type"}]}."""

    status = 422

    def __init__(self, msg: str | None = None, *, field: str | None = None,
                 where: str = "body", errors: list[dict] | None = None,
                 type: str = "value_error"):
        if errors is None:
            assert msg is not None, "Invalid needs a message or a list of errors"
            if field is None:  # messages are written "field: rule"
                field = msg.split(":", 1)[0] if ":" in msg else None
            loc = [where, *([field] if field else [])]
            errors = [{"loc": loc, "msg": msg, "type": type}]
        super().__init__(errors)

    @property
    def errors(self) -> list[dict]:
        return self.detail


class UnsafePath(DomainError, ValueError):
    """400. Also a ValueError: it is the answer to bad user input."""

    status = 400


class Unauthorized(DomainError):
    status = 401

    def __init__(self, detail: str = "authentication required", *,
                 headers: dict[str, str] | None = None):
        # Bearer by default: API clients learn how to authenticate (headers={} for none).
        super().__init__(detail, headers={"WWW-Authenticate": "Bearer"} if headers is None
                         else headers)


class Forbidden(DomainError):
    status = 403


class NotFound(DomainError):
    status = 404


class MethodNotAllowed(DomainError):
    status = 405

    def __init__(self, detail: str, *, allow: list[str]):
        super().__init__(detail, headers={"Allow": ", ".join(allow)})


class Conflict(DomainError):
    status = 409


class TooManyAttempts(DomainError):
    status = 429

    def __init__(self, detail: str, *, retry_after_s: float):
        super().__init__(detail, headers={"Retry-After": str(int(retry_after_s) + 1)})


class Unavailable(DomainError):
    status = 503


class InsufficientStorage(DomainError):
    status = 507
