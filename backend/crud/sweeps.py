"""Sweeps (groups of runs submitted as one): create with their members' runs in one
transaction, get, list; the one definition of a sweep's status."""

from __future__ import annotations

import secrets
from collections import Counter
from dataclasses import dataclass

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session, defer, selectinload

from backend.crud.runs import create_run
from backend.models import FINISHED, Run, Sweep, SweepMember, utcnow
from jobs.spec import JobSpec

# A member whose 422 errors kept it from launching, and one whose run was deleted since.
INVALID, DELETED = "invalid", "deleted"


def member_status(m: SweepMember) -> str:
    if m.errors:
        return INVALID
    return m.run.status if m.run is not None else DELETED


def sweep_status(sweep: Sweep) -> str:
    """The one rule (docs/sweeps.md). Over the launched members' runs (invalid and deleted ones
    left out): `queued` while none has started; `running` while any is queued or running and
    another has started or finished; once all finished: `succeeded` / `cancelled` when every one
    did so, `failed` when none succeeded, else `partial`. A sweep without any launched run
    (every one deleted since) is `failed`."""
    runs = [m.run.status for m in sweep.members if not m.errors and m.run is not None]
    if not runs:
        return "failed"
    active = [s for s in runs if s not in FINISHED]
    if active:
        return "queued" if all(s == "queued" for s in runs) else "running"
    for every in ("succeeded", "cancelled"):
        if all(s == every for s in runs):
            return every
    return "partial" if "succeeded" in runs else "failed"


def counts(sweep: Sweep) -> dict[str, int]:
    """Members per status (run statuses, plus `invalid` and `deleted`), and `total`."""
    c = Counter(member_status(m) for m in sweep.members)
    return {**dict(sorted(c.items())), "total": len(sweep.members)}


def create_sweep(db: Session, *, name: str, owner: str, base: dict, grid: dict | None,
                 tags: list[str], notes: str,
                 members: list[tuple[dict, JobSpec | None, list[dict] | None, dict | None]]
                 ) -> Sweep:
    """The sweep, its members and a queued run for each valid one, committed together: a
    restart can lose none of them (the reconciler publishes a queued run whose message was
    lost). `members`: (overrides, spec or None, errors or None, predicted) in order."""
    sweep = Sweep(id=secrets.token_hex(6), name=name, owner=owner, created_at=utcnow(),
                  base=base, grid=grid, tags=tags, notes=notes)
    db.add(sweep)
    for i, (overrides, spec, errors, predicted) in enumerate(members):
        assert (spec is None) != (errors is None), "a member has a spec or errors"
        run = None if spec is None else create_run(db, spec, owner=owner, tags=tags, notes="",
                                                   commit=False)
        sweep.members.append(SweepMember(position=i, overrides=overrides, errors=errors,
                                         predicted=predicted, run=run))
    db.commit()
    return sweep


# The members' runs without their summaries and provenance (the sweep shows key figures only).
_MEMBERS = selectinload(Sweep.members).selectinload(SweepMember.run).options(
    defer(Run.summary), defer(Run.provenance))


def get_sweep(db: Session, sweep_id: str) -> Sweep | None:
    return db.scalar(select(Sweep).where(Sweep.id == sweep_id).options(_MEMBERS))


def sweep_of_run(db: Session, run_id: str) -> str | None:
    return db.scalar(select(SweepMember.sweep_id).where(SweepMember.run_id == run_id))


@dataclass
class SweepFilter:
    owner: str | None = None
    q: str | None = None
    tag: str | None = None
    status: str | None = None  # comma-separated derived statuses (sweep_status)


def list_sweeps(db: Session, f: SweepFilter, *, limit: int = 50,
                offset: int = 0) -> tuple[list[Sweep], int | None]:
    """Newest first. The status is derived from the members, so that filter applies to the
    rows read (at most 1000 past `offset`): the next offset, or None at the end."""
    stmt = select(Sweep).options(_MEMBERS).order_by(Sweep.created_at.desc(), Sweep.id.desc())
    if f.owner:
        stmt = stmt.where(Sweep.owner == f.owner)
    if f.q:
        like = f"%{f.q.lower().replace('%', '').replace('_', '')}%"
        stmt = stmt.where(or_(func.lower(Sweep.name).like(like),
                              func.lower(Sweep.notes).like(like), Sweep.id == f.q))
    want = set(f.status.split(",")) if f.status else None
    out: list[Sweep] = []
    rows = list(db.scalars(stmt.offset(offset).limit(1000)))
    for n, s in enumerate(rows):
        if f.tag and f.tag not in (s.tags or []):
            continue
        if want and sweep_status(s) not in want:
            continue
        out.append(s)
        if len(out) == limit:
            more = n + 1 < len(rows)
            return out, (offset + n + 1 if more else None)
    return out, None
