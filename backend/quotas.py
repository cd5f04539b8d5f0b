"""Quotas (docs/security.md "Quotas"): what one submission may ask for, and how much of the
shared slots one user may hold. The one place their rules live: the submit paths (POST
/api/runs, every member of a sweep, POST /api/runs/{id}/resume) call `spec_errors` and
`check_submit`; GET /api/users/{name}/limits and the new-run form show `limits`.

Spec bounds (server-wide, Settings.quota_*): `runtime.timeout_s` at most quota_max_timeout_s;
the hang watch on and `runtime.hang_timeout_s` at least quota_min_hang_timeout_s (0 turns the
watch off: below any positive bound). A 422 naming the field, the bound and the setting.
Admins are exempt in team mode: they set the bounds, and their runs are the operator's.

Per-user limits at submit, counted over every run the submission adds (a sweep's members
together, all or nothing: 403 and nothing created):
- max_world_size and max_concurrent_runs (queued + running; backend/permissions.py, identity);
- max_slot_hours: slot-hours (world size x hours) over the rolling window quota_window_s.
  Charged: a finished run, world size x its time inside the window (measured); a queued or
  running run, world size x its timeout (reserved: the most it can hold, runtime.timeout_s as
  the worker caps it); the submission, world size x timeout of each run it adds (reserved).
  Reserving before a run starts is what bounds a submission: with measured usage alone, a user
  who has used nothing could queue 256 week-long runs and the quota would bite only once they
  held every slot. A run's reservation turns into what it used when it finishes.

Team mode applies every default; local mode (auth none) only the settings set explicitly."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from backend import permissions
from backend.core.config import Settings
from backend.core.identity import Principal
from backend.errors import Forbidden
from backend.models import FINISHED, Run, User, utcnow
from jobs.spec import JobSpec
from paralab_core.config import job_timeout_s

# The clock every quota reads (tests replace it: no test waits for a window to move).
clock = utcnow


def setting(settings: Settings, name: str) -> float | None:
    """A quota setting's value where it applies (team mode, or set explicitly in local mode);
    None where it does not, or where it is 0 (the setting's "no bound")."""
    if settings.auth == "required" or name in settings.model_fields_set:
        return getattr(settings, name) or None
    return None


def env_name(name: str) -> str:
    return f"PARALAB_{name.upper()}"


def bounds(settings: Settings, user: Principal | None) -> tuple[float | None, float | None]:
    """(max timeout_s, min hang_timeout_s) that bind `user`; None: no bound."""
    if user is None or (settings.auth == "required" and permissions.at_least(user, "admin")):
        return None, None
    return (setting(settings, "quota_max_timeout_s"),
            setting(settings, "quota_min_hang_timeout_s"))


def spec_errors(settings: Settings, user: Principal | None, spec: JobSpec) -> list[dict]:
    """422 entries for the spec bounds `spec` breaks ([] when none)."""
    top, floor = bounds(settings, user)
    errors = []
    rt = spec.runtime
    if top is not None and rt.timeout_s > top:
        errors.append({"loc": ["body", "runtime", "timeout_s"], "type": "quota",
                       "msg": f"at most {top:g} s on this server ({rt.timeout_s:g} asked; the "
                              f"admin sets {env_name('quota_max_timeout_s')})"})
    if floor is not None and rt.hang_timeout_s < floor:
        asked = ("0 turns the hang watch off, which this server does not allow"
                 if rt.hang_timeout_s == 0 else f"{rt.hang_timeout_s:g} asked")
        errors.append({"loc": ["body", "runtime", "hang_timeout_s"], "type": "quota",
                       "msg": f"at least {floor:g} s on this server ({asked}; the admin sets "
                              f"{env_name('quota_min_hang_timeout_s')})"})
    return errors


def reserve_s(settings: Settings, world_size: int, timeout_s: float | None) -> float:
    """Slot-seconds a queued or running run holds at most (the worker caps its timeout)."""
    cap = settings.max_job_timeout_s
    return world_size * (cap if timeout_s is None else
                         job_timeout_s({"runtime": {"timeout_s": timeout_s}}, cap))


def slot_hours_limit(settings: Settings, row: User | None) -> float | None:
    own = row.max_slot_hours if row is not None else None
    return own if own is not None else setting(settings, "default_max_slot_hours")


@dataclass(frozen=True)
class Usage:
    """One user's runs as the slot-hours quota counts them, at `now`."""

    now: datetime
    window_s: float
    active: int             # queued + running runs
    reserved_s: float       # slot-seconds those reserve
    finished: tuple[tuple[int, float, float], ...]  # (world size, start, end) as epoch s

    def used_at(self, t: float) -> float:
        """Slot-seconds the finished runs used inside the window ending at epoch `t`."""
        lo = t - self.window_s
        return sum(w * max(0.0, min(end, t) - max(start, lo)) for w, start, end in self.finished)

    @property
    def used_s(self) -> float:
        return self.used_at(self.now.timestamp())

    def frees_at(self, budget_s: float) -> datetime | None:
        """The first time the finished runs' usage is down to `budget_s` as the window moves
        on (None: never, the budget is negative). The usage is linear between the times a
        run's start or end leaves the window, so it is evaluated there and interpolated."""
        if budget_s < 0:
            return None
        now = self.now.timestamp()
        prev, used = now, self.used_at(now)
        if used <= budget_s:
            return self.now
        for t in sorted({x + self.window_s for _, s, e in self.finished for x in (s, e)
                         if x + self.window_s > now}):
            nxt = self.used_at(t)
            if nxt <= budget_s:
                at = prev + (t - prev) * (used - budget_s) / (used - nxt)
                return datetime.fromtimestamp(at, UTC)
            prev, used = t, nxt
        raise AssertionError("every finished run leaves the window")


def usage(db: Session, settings: Settings, username: str, now: datetime | None = None) -> Usage:
    now = now or clock()
    since = now - timedelta(seconds=settings.quota_window_s)
    active = db.execute(select(Run.world_size, Run.spec["runtime"]["timeout_s"].as_float())
                        .where(Run.owner == username, Run.status.in_(permissions.ACTIVE))).all()
    done = db.execute(select(Run.world_size, Run.started_at, Run.finished_at).where(
        Run.owner == username, Run.status.in_(FINISHED), Run.finished_at > since,
        Run.started_at.is_not(None))).all()
    return Usage(now=now, window_s=settings.quota_window_s, active=len(active),
                 reserved_s=sum(reserve_s(settings, w, t) for w, t in active),
                 finished=tuple((w, s.timestamp(), f.timestamp()) for w, s, f in done))


def needs_lock(db: Session, settings: Settings, user: Principal | None) -> bool:
    """Whether a submission counts the user's runs (then two at once must not both pass)."""
    return user is not None and (user.max_concurrent_runs is not None or
                                 slot_hours_limit(settings, db.get(User, user.id)) is not None)


def _span(seconds: float) -> str:
    for unit, n in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= n and seconds % n == 0:
            k = seconds // n
            return f"{k:g} {unit}{'' if k == 1 else 's'}"
    return f"{seconds:g} s"


def check_submit(db: Session, settings: Settings, user: Principal | None,
                 specs: list[JobSpec]) -> None:
    """Forbidden (403) naming the limit, the usage and when it frees up, when the runs of this
    submission (one run, or a sweep's valid members) would exceed one of the user's limits."""
    if user is None:
        return
    assert specs, "a submission adds at least one run"
    permissions.check_world_size(user, max(s.world_size for s in specs))
    row = db.get(User, user.id)
    limit_h = slot_hours_limit(settings, row)
    if user.max_concurrent_runs is None and limit_h is None:
        return
    if db.get_bind().dialect.name == "postgresql":
        # Serialise concurrent submissions of one user, so two at once cannot both pass
        # (SQLite: services.runs.lock_for_limit took the write lock).
        db.execute(select(User.id).where(User.id == user.id).with_for_update())
    u = usage(db, settings, user.username)
    n = len(specs)
    adds = "" if n == 1 else f" and this sweep adds {n}"
    if user.max_concurrent_runs is not None and u.active + n > user.max_concurrent_runs:
        raise Forbidden(f"per-user limit max_concurrent_runs={user.max_concurrent_runs}: you "
                        f"already have {u.active} queued or running runs{adds}; it frees up as "
                        "one finishes (or cancel one)")
    if limit_h is None:
        return
    new_s = sum(reserve_s(settings, s.world_size, s.runtime.timeout_s) for s in specs)
    limit_s = limit_h * 3600
    if u.used_s + u.reserved_s + new_s <= limit_s * (1 + 1e-12):
        return
    what = "this run" if n == 1 else f"this sweep's {n} runs"
    h = 1 / 3600
    msg = (f"per-user limit max_slot_hours={limit_h:g} (world size x hours in a rolling "
           f"window of {_span(settings.quota_window_s)}): your finished runs used "
           f"{u.used_s * h:.2f}, "
           f"your {u.active} queued or running runs reserve {u.reserved_s * h:.2f} and {what} "
           f"would reserve {new_s * h:.2f} (world size x runtime.timeout_s); ")
    headers = None
    if new_s > limit_s:
        msg += "lower runtime.timeout_s, the world size or the number of runs"
    elif (at := u.frees_at(limit_s - u.reserved_s - new_s)) is None:
        msg += ("it frees up as your queued or running runs finish (each then counts what it "
                "used), or cancel one")
    else:
        wait = max(0.0, (at - u.now).total_seconds())
        msg += (f"enough frees up at {at.isoformat(timespec='seconds')} (in {wait / 3600:.1f} "
                "h) as your finished runs leave the window")
        headers = {"Retry-After": str(int(wait) + 1)}
    raise Forbidden(msg + " (ask an admin to raise it)", headers=headers)


def limits(db: Session, settings: Settings, user: Principal) -> dict:
    """What binds `user` and where they stand (GET /api/users/{name}/limits, the form)."""
    top, floor = bounds(settings, user)
    limit_h = slot_hours_limit(settings, db.get(User, user.id))
    u = usage(db, settings, user.username)
    return {"username": user.username, "mode": "team" if settings.auth == "required"
            else "local", "max_world_size": min(settings.max_world_size,
                                                user.max_world_size or settings.max_world_size),
            "max_concurrent_runs": user.max_concurrent_runs, "active_runs": u.active,
            "max_slot_hours": limit_h, "window_s": settings.quota_window_s,
            "slot_hours_used": round(u.used_s / 3600, 4),
            "slot_hours_reserved": round(u.reserved_s / 3600, 4),
            "max_timeout_s": top, "min_hang_timeout_s": floor,
            "bounds_exempt": settings.auth == "required" and permissions.at_least(user,
                                                                                 "admin"),
            "settings": {k: env_name(k) for k in (
                "quota_max_timeout_s", "quota_min_hang_timeout_s", "quota_window_s",
                "default_max_slot_hours")}}
