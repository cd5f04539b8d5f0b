"""Who is making a request: the Principal that routes, permissions and limits look at, and
the small pure helpers around it (client address, the post-login redirect)."""

from __future__ import annotations

from dataclasses import dataclass

from starlette.requests import Request

from backend.core.config import Settings
from backend.models import User


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


def principal_of(user: User, settings: Settings, *, via: str,
                 credential_id: int | None = None) -> Principal:
    mc = user.max_concurrent_runs
    mw = user.max_world_size
    return Principal(
        id=user.id, username=user.username, role=user.role,
        max_concurrent_runs=mc if mc is not None else settings.default_max_concurrent_runs,
        max_world_size=mw if mw is not None else settings.default_user_max_world_size,
        via=via, credential_id=credential_id)


def client_address(request: Request) -> str:
    return request.client.host if request.client else "?"


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
