"""Who may do what: the one place roles are interpreted.

viewer: read everything (runs, logs, files, comparisons) and manage their own API tokens and
        password; writes nothing else (no stars, no saved comparisons, no runs).
member: also submit runs and sweeps; cancel, edit and delete their own runs; cancel their own
        sweeps; star runs; save comparisons.
admin:  everything, including other people's runs, users and the audit log.

Per-user limits (maximum world size here; concurrent queued+running runs, slot-hours and the
spec bounds in backend/quotas.py) are checked at submit.
"""

from __future__ import annotations

from backend.core.identity import Principal
from backend.errors import Forbidden
from backend.models import Run

RANK = {"viewer": 0, "member": 1, "admin": 2}
ACTIVE = ("queued", "running")


def at_least(user: Principal, role: str) -> bool:
    return RANK.get(user.role, -1) >= RANK[role]


def can_submit(user: Principal) -> bool:
    return at_least(user, "member")


def can_modify_run(user: Principal, run: Run) -> bool:
    """Cancel, edit (name, tags, notes) and delete."""
    return at_least(user, "admin") or (at_least(user, "member") and run.owner == user.username)


def require_role(user: Principal, role: str, what: str) -> None:
    if not at_least(user, role):
        raise Forbidden(f"{what} needs the {role} role (you are {user.role})")


def require_member(user: Principal, what: str) -> None:
    """Any write to the shared history (stars, saved comparisons): viewers are read-only."""
    require_role(user, "member", what)


def require_submit(user: Principal) -> None:
    require_role(user, "member", "submitting runs")


def require_modify_run(user: Principal, run: Run, action: str) -> None:
    if not can_modify_run(user, run):
        if not at_least(user, "member"):
            raise Forbidden(f"{action} needs the member role (you are {user.role})")
        raise Forbidden(f"only the run's owner ({run.owner}) or an admin may {action} "
                                 f"run {run.id}")


def can_modify_sweep(user: Principal, owner: str) -> bool:
    """A sweep is shared like a run: its owner (a member) or an admin cancels it."""
    return at_least(user, "admin") or (at_least(user, "member") and owner == user.username)


def require_modify_sweep(user: Principal, sweep, action: str) -> None:
    if not can_modify_sweep(user, sweep.owner):
        if not at_least(user, "member"):
            raise Forbidden(f"{action} needs the member role (you are {user.role})")
        raise Forbidden(f"only the sweep's owner ({sweep.owner}) or an admin may {action} "
                        f"sweep {sweep.id}")


def require_admin(user: Principal, what: str) -> None:
    require_role(user, "admin", what)


def check_world_size(user: Principal, world_size: int) -> None:
    if user.max_world_size is not None and world_size > user.max_world_size:
        raise Forbidden(f"per-user limit max_world_size={user.max_world_size}: this "
                                 f"run needs world size {world_size} (ask an admin to raise it)")
