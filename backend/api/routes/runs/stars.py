"""Stars: a user's own bookmarks on runs (GET /api/stars lists them, routes/history.py).
Viewers write nothing, stars included (backend/permissions.py)."""

from __future__ import annotations

from fastapi import APIRouter

from backend import permissions
from backend.api.deps import DbDep, RunDep, UserDep
from backend.models import Star

router = APIRouter(prefix="/api/runs", tags=["runs"])


@router.put("/{run_id}/star")
def star_run(db: DbDep, run: RunDep, user: UserDep) -> dict:
    permissions.require_member(user, "starring runs")
    if db.get(Star, (user.id, run.id)) is None:
        db.add(Star(user_id=user.id, run_id=run.id))
        db.commit()
    return {"run_id": run.id, "starred": True}


@router.delete("/{run_id}/star")
def unstar_run(db: DbDep, run: RunDep, user: UserDep) -> dict:
    permissions.require_member(user, "starring runs")
    star = db.get(Star, (user.id, run.id))
    if star is not None:
        db.delete(star)
        db.commit()
    return {"run_id": run.id, "starred": False}
