"""Sweeps: one submission, a group of runs (backend/services/sweeps.py; docs/sweeps.md)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Query, Request

from backend import crud
from backend.api.deps import CheckedParams, DbDep, SettingsDep, UserDep
from backend.api.sweep_schemas import SweepCheck, SweepOut, SweepPage
from backend.core.identity import client_address
from backend.errors import NotFound
from backend.services import sweeps as service
from backend.services.sweep_body import MAX_MEMBERS

router = APIRouter(prefix="/api/sweeps", tags=["sweeps"], dependencies=[CheckedParams])
# The dry run has a path of its own: under /api/sweeps, "/validate" would also match
# GET /api/sweeps/{sweep_id} (an OPTIONS answer advertising a GET the schema does not have)
checks = APIRouter(prefix="/api/sweep-checks", tags=["sweeps"], dependencies=[CheckedParams])

_DESCRIPTION = (
    "A group of runs from one submission. `base`: a job spec or {\"preset\": NAME, "
    "...overrides}. Exactly one of `grid` and `members`. `grid`: {dotted spec path: [values]}, "
    "the cartesian product in key order (last key fastest); a value that is an object is "
    "deep-merged at its path, and the key \".\" is the spec's root, so one axis can change "
    "several fields together, e.g. {\".\": [{\"parallel\": {\"dp\": 2}, \"runtime\": "
    "{\"nproc_per_node\": 2}}, ...]}. `members`: a list of override objects, each deep-merged "
    f"into the base. At most {MAX_MEMBERS} members. Optional `name`, `queue` (every member's "
    "runtime.queue), `tags` (given to every member run) and `notes`. A member that "
    "POST /api/runs would refuse is kept with its 422 `errors` and not launched; when none is "
    "valid the answer is 422 with each member's errors under [\"body\", \"members\", i, ...].")
_EXAMPLE = {"name": "zero stages x buckets", "base": {"preset": "ddp", "model": {"arch": "mlp"}},
            "grid": {"parallel.zero_stage": [0, 2, 3], "parallel.bucket_mb": [1, 25]}}


def _sweep(db, sweep_id: str):
    s = crud.get_sweep(db, sweep_id)
    if s is None:
        raise NotFound(f"no sweep {sweep_id!r}")
    return s


@router.post("", status_code=201, response_model=SweepOut, description=_DESCRIPTION)
def submit_sweep(
    request: Request, db: DbDep, settings: SettingsDep, user: UserDep,
    body: Annotated[dict[str, Any], Body(examples=[_EXAMPLE])],
    force: bool = Query(False, description="launch members whose predicted memory exceeds "
                        "what the workers report"),
) -> SweepOut:
    s = service.submit(db, settings, body, owner=user, force=force,
                       client=client_address(request))
    return SweepOut.of(s, user)


@checks.post("", response_model=SweepCheck)
def validate_sweep(
    db: DbDep, settings: SettingsDep, user: UserDep,
    body: Annotated[dict[str, Any], Body(examples=[_EXAMPLE])],
    force: bool = Query(False, description="as for POST /api/sweeps"),
) -> SweepCheck:
    """A dry run of POST /api/sweeps (the sweep builder on /sweeps calls it before launch): the
    same checks and the same 422 / 403 refusals, nothing stored; otherwise the member count,
    how many are valid, and each member's overrides and errors."""
    return SweepCheck(**service.validate(db, settings, body, owner=user, force=force))


@router.get("", response_model=SweepPage)
def list_sweeps(
    db: DbDep, user: UserDep,
    status: str | None = Query(None, description="comma-separated sweep statuses"),
    owner: str | None = None,
    tag: str | None = None,
    q: str | None = Query(None, max_length=200, description="text search in name/notes"),
    offset: int = Query(0, ge=0, le=1_000_000),
    limit: int = Query(50, ge=1, le=200),
) -> SweepPage:
    """Newest first, without their members (GET /api/sweeps/{id} has them)."""
    rows, nxt = crud.list_sweeps(db, crud.SweepFilter(owner=owner, q=q, tag=tag, status=status),
                                 limit=limit, offset=offset)
    return SweepPage(items=[SweepOut.of(s, user, full=False) for s in rows], next_offset=nxt)


@router.get("/{sweep_id}", response_model=SweepOut)
def get_sweep(db: DbDep, user: UserDep, sweep_id: str) -> SweepOut:
    return SweepOut.of(_sweep(db, sweep_id), user)


@router.post("/{sweep_id}/cancel", response_model=SweepOut)
def cancel_sweep(request: Request, db: DbDep, settings: SettingsDep, user: UserDep,
                 sweep_id: str) -> SweepOut:
    """Cancel every queued and running member run (the run cancel path); 409 when none is."""
    s = service.cancel(db, settings, _sweep(db, sweep_id), actor=user,
                       client=client_address(request))
    return SweepOut.of(s, user)
