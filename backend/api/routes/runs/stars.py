"""Stars: a user's own bookmarks on runs (GET /api/stars lists them, routes/history.py).
Viewers write nothing, stars included (backend/permissions.py)."""

from __future__ import annotations

from fastapi import APIRouter

from backend import crud, permissions
from backend.api.deps import DbDep, RunDep, UserDep

router = APIRouter(prefix="/api/runs", tags=["runs"])


@router.put("/{run_id}/star")
def star_run(db: DbDep, run: RunDep, user: UserDep) -> dict:
    permissions.require_member(user, "starring runs")
    crud.set_star(db, user.id, run.id, True)
    return {"run_id": run.id, "starred": True}


@router.delete("/{run_id}/star")
def unstar_run(db: DbDep, run: RunDep, user: UserDep) -> dict:
    permissions.require_member(user, "starring runs")
    crud.set_star(db, user.id, run.id, False)
    return {"run_id": run.id, "starred": False}
