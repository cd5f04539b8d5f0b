"""A run's checkpoints, and resuming from one: a new run linked to its parent."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Query, Request

from backend import services
from backend.api.deps import DbDep, RunDep, SettingsDep, UserDep
from backend.api.routes.runs.crud import RunView, view
from backend.core.identity import client_address
from backend.services import resume

router = APIRouter(prefix="/api/runs", tags=["runs"])


@router.get("/{run_id}/checkpoints")
def list_checkpoints(run: RunDep, settings: SettingsDep) -> list[dict[str, Any]]:
    """Complete checkpoints only (every rank's shard and the commit marker), oldest first."""
    return resume.checkpoints(settings, run)


@router.post("/{run_id}/resume", status_code=201, response_model=RunView)
def resume_run(
    request: Request, db: DbDep, run: RunDep, settings: SettingsDep, user: UserDep,
    body: Annotated[dict[str, Any], Body(
        description="`step` (default: the latest complete checkpoint) and overrides of the "
                    "parent's spec: name, parallel, runtime, train (a new layout reshards "
                    "where torch.distributed.checkpoint can), faults; tags, notes.",
        examples=[{"step": 2}, {"step": 2, "parallel": {"dp": 2, "tp": 2},
                                "runtime": {"nproc_per_node": 4}}])] = None,
    force: bool = Query(False, description="submit even if predicted memory exceeds what the "
                        "workers report"),
) -> RunView:
    """A new run from the parent's complete checkpoint at `step`. Any member may resume any
    run, their own or another's (docs/security.md, Roles): the new run is the caller's,
    within the caller's limits; the parent is only read."""
    spec_body = resume.resume_body(settings, run, body or {})
    child = services.submit(db, settings, spec_body, owner=user, force=force,
                            client=client_address(request))
    return view(db, user, child, starred=set())
