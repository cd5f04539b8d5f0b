"""The shared history around runs: stars, saved comparisons with a shareable link, the audit
log (admins). A run's stars and notes are under /api/runs (routes/runs/)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Query, Response
from pydantic import BaseModel, ConfigDict, Field, field_validator

from backend import crud, permissions
from backend.api.deps import CheckedParams, DbDep, UserDep
from backend.api.schemas import INT64_MAX, Input, SafeStr
from backend.models import SavedComparison

router = APIRouter(prefix="/api", tags=["history"], dependencies=[CheckedParams])


class ComparisonIn(Input):
    model_config = ConfigDict(extra="forbid")
    name: SafeStr = Field(min_length=1, max_length=200)
    # the rules below, declared in the schema too (uniqueItems, each ID 1-32 characters)
    run_ids: list[Annotated[SafeStr, Field(min_length=1, max_length=32)]] = Field(
        min_length=2, max_length=4, json_schema_extra={"uniqueItems": True})

    @field_validator("run_ids")
    @classmethod
    def _distinct(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("run_ids: each run at most once")
        return v


class ComparisonOut(BaseModel):
    id: str
    name: str
    owner: str
    run_ids: list[str]
    created_at: datetime
    url: str = Field(description="shareable dashboard link: /compare?ids=...&saved=<id>")

    @classmethod
    def of(cls, c: SavedComparison) -> ComparisonOut:
        ids = ",".join(quote(x, safe="") for x in c.run_ids)
        return cls(id=c.id, name=c.name, owner=c.owner, run_ids=list(c.run_ids),
                   created_at=c.created_at, url=f"/compare?ids={ids}&saved={c.id}")


class AuditOut(BaseModel):
    id: int
    ts: datetime
    actor: str
    action: str
    target: str | None
    detail: dict[str, Any] | None
    client: str | None


@router.get("/stars", response_model=list[str])
def my_stars(db: DbDep, user: UserDep) -> list[str]:
    """IDs of the runs you starred, newest star first (PUT/DELETE /api/runs/{id}/star)."""
    return crud.stars_of(db, user.id)


@router.post("/comparisons", status_code=201, response_model=ComparisonOut)
def save_comparison(db: DbDep, user: UserDep, body: ComparisonIn) -> ComparisonOut:
    """Save 2-4 runs side by side under a name; `url` is the link to share. Members and
    admins: a saved comparison is shared, and viewers write nothing."""
    permissions.require_member(user, "saving comparisons")
    return ComparisonOut.of(crud.create_comparison(db, name=body.name, owner=user.username,
                                                   run_ids=body.run_ids))


@router.get("/comparisons", response_model=list[ComparisonOut])
def list_comparisons(db: DbDep, owner: str | None = None,
                     limit: int = Query(100, ge=1, le=500)) -> list[ComparisonOut]:
    return [ComparisonOut.of(c) for c in crud.list_comparisons(db, owner=owner, limit=limit)]


@router.get("/comparisons/{comparison_id}", response_model=ComparisonOut)
def get_comparison(db: DbDep, comparison_id: str) -> ComparisonOut:
    return ComparisonOut.of(crud.get_comparison(db, comparison_id))


@router.delete("/comparisons/{comparison_id}", status_code=204)
def delete_comparison(db: DbDep, user: UserDep, comparison_id: str) -> Response:
    c = crud.get_comparison(db, comparison_id)
    if c.owner != user.username:
        permissions.require_admin(user, "deleting another user's comparison")
    crud.delete_comparison(db, c)
    return Response(status_code=204)


@router.get("/audit", response_model=list[AuditOut])
def audit_log(db: DbDep, user: UserDep,
              action: str | None = Query(None, description="comma-separated actions"),
              actor: str | None = None,
              before: int | None = Query(None, ge=0, le=INT64_MAX,
                                         description="entries with a smaller id"),
              limit: int = Query(100, ge=1, le=1000)) -> list[AuditOut]:
    """Submissions, cancellations, edits, deletions, user and role changes, tokens and failed
    logins, newest first (admins only)."""
    permissions.require_admin(user, "reading the audit log")
    return [AuditOut(id=e.id, ts=e.ts, actor=e.actor, action=e.action, target=e.target,
                     detail=e.detail, client=e.client)
            for e in crud.list_audit(db, action=action, actor=actor, before_id=before,
                                     limit=limit)]
