"""`paralab users ...` (operator commands on the backend host's database) and `paralab token
...` (personal API tokens over HTTP). Wired in backend/cli/__init__.py."""

from __future__ import annotations

import getpass
import json
import sys

from backend import crud
from backend.cli._httpx import httpx
from backend.core.config import get_settings
from backend.core.db import get_sessionmaker
from backend.errors import NotFound


def _out(text: str, err: bool = False) -> None:
    (sys.stderr if err else sys.stdout).write(text + "\n")


def _read_password(from_stdin: bool, prompt: str = "Password: ", confirm: bool = True) -> str:
    if from_stdin:
        return sys.stdin.readline().rstrip("\r\n")
    pw = getpass.getpass(prompt)
    if confirm and getpass.getpass("Again: ") != pw:
        raise ValueError("passwords do not match")
    return pw


def cli_users(a) -> int:
    """Operator commands on the backend host's database (PARALAB_* / DATABASE_URL)."""
    settings = get_settings()
    with get_sessionmaker(settings.db_url)() as db:
        if a.users_cmd == "create":
            role = "admin" if a.admin else a.role
            pw = _read_password(a.password_stdin)
            user = crud.create_user(db, settings, a.name, pw, role=role, actor="cli")
            _out(f"created {user.username} ({user.role})")
            return 0
        if a.users_cmd == "list":
            for u in crud.list_users(db):
                limits = (f"runs<={u.max_concurrent_runs} world<={u.max_world_size} "
                          f"slot-hours<={u.max_slot_hours}")
                _out(f"{u.username:20} {u.role:7} {'active' if u.is_active else 'disabled':8} "
                      f"{limits}")
            return 0
        user = crud.get_user(db, a.name)
        if user is None or user.username == crud.LOCAL_USERNAME:
            raise NotFound(f"no user {a.name!r}")
        changes: dict = {}
        if a.role:
            changes["role"] = a.role
        if a.max_concurrent_runs is not None:
            changes["max_concurrent_runs"] = a.max_concurrent_runs if \
                a.max_concurrent_runs >= 0 else None
        if a.max_world_size is not None:
            changes["max_world_size"] = a.max_world_size if a.max_world_size > 0 else None
        if a.max_slot_hours is not None:  # negative: back to the server default
            changes["max_slot_hours"] = None if a.max_slot_hours < 0 else a.max_slot_hours
        if a.active:
            changes["is_active"] = a.active == "yes"
        if changes:
            crud.update_user(db, user, changes, actor="cli")
        if a.password_stdin:
            crud.set_password(db, settings, user, _read_password(True), actor="cli")
        _out(f"updated {user.username} ({user.role}, "
              f"{'active' if user.is_active else 'disabled'})")
        return 0


def cli_token(a, url: str, headers: dict, error_cls) -> int:
    """Personal API tokens over HTTP. Authenticates with PARALAB_TOKEN, or with --user and a
    password (a short-lived session; the CLI sends the Origin header a browser would)."""
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
