"""Response shapes of /api/sweeps (backend/api/routes/sweeps.py; docs/sweeps.md)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from backend import permissions
from backend.core.identity import Principal
from backend.crud.sweeps import counts, member_status, sweep_status
from backend.models import METRIC_COLUMNS, Sweep, SweepMember
from jobs.theory.calibration import restate

# A member's measured figures: the run's key-figure columns (models.METRIC_COLUMNS, set from
# its analysis headline), plus the headline's bytes sent per rank per step (next to the
# predicted bytes) and its per-step compute / bubble / idle means (the calibration's terms).
MEASURED_EXTRA = ("comm_bytes_per_rank", "compute_s", "bubble_s", "idle_s")


class MemberRun(BaseModel):
    name: str
    strategy: str
    world_size: int
    dp: int
    tp: int
    pp: int
    queue: str
    started_at: datetime | None
    finished_at: datetime | None
    error: str | None
    measured: dict[str, float | None] = Field(
        description="the run's key figures: " + ", ".join(METRIC_COLUMNS + MEASURED_EXTRA)
                    + " (null until the run reports its analysis)")


class SweepMemberOut(BaseModel):
    index: int
    overrides: dict[str, Any] = Field(description="deep-merged into the base")
    run_id: str | None = Field(description="null: invalid (see errors) or its run deleted")
    errors: list[dict[str, Any]] | None = Field(
        description="the 422 detail POST /api/runs answers for this member; null if launched")
    status: str = Field(description="the run's status, `invalid` or `deleted`")
    predicted: dict[str, float | None] | None = Field(
        description="jobs.theory.predict for the member's spec: peak_memory_bytes (per rank), "
                    "comm_bytes_per_rank, bubble_fraction, step_time_s (no overlap), "
                    "step_time_full_overlap_s")
    run: MemberRun | None = None

    @classmethod
    def of(cls, m: SweepMember) -> SweepMemberOut:
        r = m.run
        run = None if r is None else MemberRun(
            name=r.name, strategy=r.strategy, world_size=r.world_size, dp=r.dp, tp=r.tp, pp=r.pp,
            queue=r.queue, started_at=r.started_at, finished_at=r.finished_at, error=r.error,
            measured={**{c: getattr(r, c) for c in METRIC_COLUMNS},
                      **{k: (r.metrics or {}).get(k) for k in MEASURED_EXTRA}})
        return cls(index=m.position, overrides=m.overrides, run_id=m.run_id, errors=m.errors,
                   status=member_status(m), predicted=m.predicted, run=run)


class SweepOut(BaseModel):
    id: str
    name: str
    owner: str
    status: str = Field(description="queued, running, succeeded, failed, cancelled or partial "
                        "(derived from the member runs: docs/sweeps.md)")
    created_at: datetime
    tags: list[str]
    notes: str
    counts: dict[str, int] = Field(description="members per status, and total")
    can_modify: bool = Field(False, description="whether the caller may cancel it")
    base: dict[str, Any] | None = None
    grid: dict[str, Any] | None = None
    members: list[SweepMemberOut] | None = Field(None, description="in order (list: omitted)")
    calibration: dict[str, Any] | None = Field(
        None, description="a sweep launched from the advisor (its members predicted with a "
        "cluster): the ranking re-stated with the measured figures, Spearman's rank "
        "correlation and the error per term (jobs.theory.calibration.restate)")

    @classmethod
    def of(cls, s: Sweep, user: Principal, *, full: bool = True) -> SweepOut:
        members = [SweepMemberOut.of(m) for m in s.members] if full else None
        return cls(id=s.id, name=s.name, owner=s.owner, status=sweep_status(s),
                   created_at=s.created_at, tags=s.tags or [], notes=s.notes or "",
                   counts=counts(s), can_modify=permissions.can_modify_sweep(user, s.owner),
                   base=s.base if full else None, grid=s.grid if full else None,
                   members=members, calibration=_calibration(members) if full else None)


def _calibration(members: list[SweepMemberOut]) -> dict | None:
    """Only where the members carry the advisor's breakdown (a compute term)."""
    if not any((m.predicted or {}).get("compute_s") is not None for m in members):
        return None
    return restate([{"label": m.run.name if m.run else f"member {m.index}", "index": m.index,
                     "predicted": m.predicted, "measured": m.run.measured if m.run else None}
                    for m in members if m.run_id is not None])


class SweepPage(BaseModel):
    items: list[SweepOut]
    next_offset: int | None = Field(None, description="pass as ?offset= for the next page")


class SweepCheckMember(BaseModel):
    index: int
    overrides: dict[str, Any] = Field(description="deep-merged into the base")
    errors: list[dict[str, Any]] | None = Field(
        description="the 422 detail POST /api/runs would answer for this member; null: valid")
    predicted: dict[str, float | None] | None = None


class SweepCheck(BaseModel):
    """POST /api/sweep-checks: what POST /api/sweeps would do with the body, stored nowhere."""
    members: int = Field(description="members the base and grid / member list expand to")
    valid: int = Field(description="members that would be launched")
    items: list[SweepCheckMember]
