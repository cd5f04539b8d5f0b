"""POST /api/advise: every layout of a model on a cluster that the service accepts and that
fits, ranked by predicted step time with its breakdown and reasons (docs/advisor.md)."""

from __future__ import annotations

from fastapi import APIRouter

from backend.api.advise_schemas import AdviseIn
from backend.api.deps import CheckedParams, DbDep
from backend.services.advise import run_advise

router = APIRouter(prefix="/api", tags=["advise"], dependencies=[CheckedParams])


@router.post("/advise")
def advise(body: AdviseIn, db: DbDep) -> dict:
    """Ranked candidates (top N, each with its spec, predicted breakdown, seed-004 rules,
    reasons and ruled-out neighbours) and the counts considered / pruned / invalid / not
    fitting, by reason."""
    return run_advise(db, body)
