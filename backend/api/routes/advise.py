"""POST /api/advise: every layout of a model on a cluster that the service accepts and that
fits, ranked by predicted step time with its breakdown and reasons (docs/advisor.md)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from backend.api.advise_schemas import AdviseIn
from backend.api.deps import CheckedParams, DbDep, SettingsDep, UserDep
from backend.services.advise import run_advise
from backend.services.request_limits import limits_of

router = APIRouter(prefix="/api", tags=["advise"], dependencies=[CheckedParams])


@router.post("/advise")
def advise(body: AdviseIn, db: DbDep, user: UserDep, settings: SettingsDep,
           request: Request) -> dict:
    """Ranked candidates (top N, each with its spec, predicted breakdown, seed-004 rules,
    reasons and ruled-out neighbours) and the counts considered / pruned / invalid / not
    fitting, by reason. Bounded (docs/advisor.md "Bounds"): a search over the budget is a
    422 naming the bound; every search process busy: 503 with Retry-After; over the user's
    rate limit: 429 with Retry-After."""
    limits = limits_of(request.app)
    return run_advise(db, body, settings, lambda: limits.charge("advise", user.username))
