"""The collective-sweep list (the collectives page compares these); the one "latest sweep"
rule and the query live in backend/crud/collective_sweeps.py."""

from __future__ import annotations

from fastapi import APIRouter, Query

from backend import crud
from backend.api.deps import CheckedParams, DbDep

router = APIRouter(prefix="/api", tags=["collective-sweeps"], dependencies=[CheckedParams])


def _sweep_out(r) -> dict:
    s = r.summary or {}
    return {"id": r.id, "name": r.name, "created_at": r.created_at, "queue": r.queue,
            "world_size": r.world_size, "backend": s.get("backend"), "device": s.get("device"),
            "copy_bandwidth_GBps": s.get("copy_bandwidth_GBps"),
            "results": [{k: x.get(k) for k in ("op", "algorithm", "bytes", "time_us_mean",
                                               "algbw_GBps", "busbw_GBps", "correct")}
                        for x in s.get("results") or []]}


@router.get("/collective-sweeps")
def collective_sweeps(db: DbDep,
                      ids: str | None = Query(None, description="comma-separated run IDs"),
                      limit: int = Query(20, ge=1, le=100)) -> list[dict]:
    """Collective-sweep runs with their result tables: the given IDs, else the latest."""
    return [_sweep_out(r) for r in crud.collective_sweeps(db, ids.split(",") if ids else None,
                                               limit=limit)]
