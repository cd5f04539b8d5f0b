"""Runs themselves: submit, list, inspect, edit, cancel, delete. Who may do what is decided in
backend/permissions.py; the sub-resources are the sibling modules of this package."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Query, Request
from pydantic import BaseModel, ConfigDict, Field, field_validator
from sqlalchemy.orm import Session

from backend import crud, permissions, services
from backend.api.deps import DbDep, RunDep, SettingsDep, UserDep
from backend.api.schemas import Input, RunOut, SafeStr
from backend.core.identity import Principal, client_address
from backend.crud.runs import last_progress
from backend.errors import Invalid
from backend.models import METRIC_COLUMNS, Run, utcnow
from backend.services import cluster, placement
from jobs.faultspec import describe_all
from jobs.spec import number_problem

router = APIRouter(prefix="/api/runs", tags=["runs"])


class RunView(RunOut):
    """A run as the caller sees it: `can_modify` says whether they may cancel, edit and delete
    it (the dashboard shows those buttons only then); `starred` is their own star."""

    can_modify: bool = False
    starred: bool = False
    faults: list[str] = Field([], description="the injected faults, one line each "
                              "(jobs.faultspec.describe_all)")
    nodes: list[dict[str, Any]] = Field([], description="a multi-host run's nodes: host, "
                                        "worker, ranks, status (docs/hosts.md)")
    placement_wait: str | None = Field(None, description="why a queued multi-host run is not "
                                       "placed yet: which hosts, what is missing")
    sweep_id: str | None = Field(None, description="the sweep this run is a member of")
    wait_reason: str | None = Field(None, description="why a queued run has not started: the "
                                    "reason the cluster page gives (GET /api/runs/{id} only)")
    progress: dict[str, Any] | None = Field(
        None, description="the run's last sign of progress (GET /api/runs/{id} only): {kind: "
        "'step' (a rank's end-of-step line) or 'log' (a rank's last line, no step yet), step, "
        "rank, at, age_s: seconds from `at` to now, or to finished_at once it ended}")


class RunViewPage(BaseModel):
    items: list[RunView]
    next_cursor: str | None = Field(None, description="pass as ?cursor= for the next page")


class RunPatch(Input):
    model_config = ConfigDict(extra="forbid")
    name: SafeStr | None = Field(None, min_length=1, max_length=200)
    tags: list[SafeStr] | None = Field(None, max_length=20)
    notes: SafeStr | None = Field(None, max_length=100_000)

    @field_validator("tags")
    @classmethod
    def _tags(cls, v):
        if v is None:
            return v
        v = [t.strip() for t in v]
        if not all(1 <= len(t) <= 64 for t in v):
            raise ValueError("tags: must be a list of at most 20 strings of 1-64 characters")
        return list(dict.fromkeys(v))


def _starred(db: Session, user: Principal, run_ids: list[str]) -> set[str]:
    return crud.starred_ids(db, user.id, run_ids)


def view(db: Session, user: Principal, run: Run, *, full: bool = True,
         starred: set[str] | None = None) -> RunView:
    if starred is None:
        starred = _starred(db, user, [run.id])
    return RunView(**RunOut.of(run, full=full).model_dump(),
                   can_modify=permissions.can_modify_run(user, run), starred=run.id in starred,
                   faults=describe_all((run.spec or {}).get("faults")) if full else [],
                   nodes=placement.node_view(db, run.id) if full and run.nnodes > 1 else [],
                   sweep_id=crud.sweep_of_run(db, run.id) if full else None)


_SPEC_EXAMPLE = {"preset": "ddp", "name": "my first run", "train": {"steps": 5},
                 "tags": ["demo"], "notes": ""}


@router.post("", status_code=201, response_model=RunView)
def submit_run(
    request: Request, db: DbDep, settings: SettingsDep, user: UserDep,
    body: Annotated[dict[str, Any], Body(
        description="A job spec, or {\"preset\": NAME, ...overrides} (nested fields merged); "
                    "optional run metadata `tags` (list of strings) and `notes`.",
        examples=[_SPEC_EXAMPLE])],
    force: bool = Query(False, description="submit even if predicted memory exceeds what the "
                        "workers report"),
) -> RunView:
    run = services.submit(db, settings, body, owner=user, force=force,
                          client=client_address(request))
    return view(db, user, run, starred=set())


def metric_ranges(request: Request) -> dict:
    """`min_<figure>` / `max_<figure>` query parameters (figures: models.METRIC_COLUMNS)."""
    out: dict = {}
    for c in METRIC_COLUMNS:
        for end, i in (("min", 0), ("max", 1)):
            raw = request.query_params.get(f"{end}_{c}")
            if raw is None or raw == "":
                continue
            try:
                v = float(raw)
            except ValueError:
                raise Invalid(f"{end}_{c}: must be a number, got {raw!r}", where="query") \
                    from None
            if problem := number_problem(v):  # float() reads "nan" and "inf" too
                raise Invalid(f"{end}_{c}: {problem}", where="query")
            out.setdefault(c, [None, None])[i] = v
    return {c: tuple(v) for c, v in out.items()}


_SORT = "^-?(" + "|".join(crud.SORT_KEYS) + ")$"


@router.get("", response_model=RunViewPage)
def list_runs(
    request: Request, db: DbDep, user: UserDep,
    status: str | None = Query(None, description="comma-separated statuses"),
    strategy: str | None = Query(None, description="comma-separated strategy labels"),
    owner: str | None = None,
    tag: str | None = None,
    q: str | None = Query(None, max_length=200, description="text search in name/notes"),
    sort: str = Query("-created_at", pattern=_SORT,
                      description="a column, `-` first for descending; runs without the "
                                  "figure come last. Filters: min_<figure>, max_<figure> for "
                                  "each figure column (step_time_s, peak_memory_bytes, ...)"),
    cursor: str | None = None,
    limit: int = Query(50, ge=1, le=500),
) -> RunViewPage:
    f = crud.RunFilter(status=status, strategy=strategy, owner=owner, tag=tag, q=q,
                       ranges=metric_ranges(request))
    try:
        rows, nxt = crud.list_runs(db, f, sort=sort, cursor=cursor, limit=limit)
    except ValueError as exc:
        raise Invalid(str(exc), field="cursor", where="query") from exc
    starred = _starred(db, user, [r.id for r in rows])
    return RunViewPage(items=[view(db, user, r, full=False, starred=starred) for r in rows],
                       next_cursor=nxt)


@router.get("/{run_id}", response_model=RunView)
def get_run(db: DbDep, run: RunDep, user: UserDep, settings: SettingsDep) -> RunView:
    out = view(db, user, run)
    out.wait_reason = cluster.why_queued(db, settings, run)
    if run.nnodes > 1:  # the placer's reason, which why_queued gives for a multi-host run
        out.placement_wait = out.wait_reason
    if run.status != "queued":
        # the page's "last progress N s ago": the age is the server's (the browser's clock
        # may differ); a finished run's is measured to when it ended (how long it stalled)
        p = last_progress(db, run.id)
        if p is not None:
            end = run.finished_at or utcnow()
            p["age_s"] = round(max((end - p["at"]).total_seconds(), 0.0), 1)
            out.progress = p
    return out


@router.patch("/{run_id}", response_model=RunView)
def edit_run(request: Request, db: DbDep, run: RunDep, user: UserDep, body: RunPatch) -> RunView:
    """Change a run's name, tags or notes (stored and returned literally)."""
    permissions.require_modify_run(user, run, "edit")
    run = services.edit(db, run, body.model_dump(exclude_unset=True, exclude_none=True),
                        actor=user.username, client=client_address(request))
    return view(db, user, run)


@router.delete("/{run_id}", status_code=204)
def delete_run(request: Request, db: DbDep, run: RunDep, user: UserDep,
               settings: SettingsDep) -> None:
    """Remove a finished run from the history, with its logs and files."""
    permissions.require_modify_run(user, run, "delete")
    services.delete(db, settings, run, actor=user.username, client=client_address(request))


@router.post("/{run_id}/cancel", response_model=RunView)
def cancel_run(request: Request, db: DbDep, run: RunDep, settings: SettingsDep,
               user: UserDep) -> RunView:
    permissions.require_modify_run(user, run, "cancel")
    run = services.cancel(db, settings, run, actor=user.username, client=client_address(request))
    return view(db, user, run)
