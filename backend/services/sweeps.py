"""Sweeps: validate every member as a run submission would be, store the sweep with a queued
run per valid member in one transaction, publish their messages; cancel a sweep as a whole.
Restart-safe by construction: every member run exists, queued, from the submit on, so after a
backend restart the reconciler (backend/services/reconcile.py) publishes any whose message was
lost, and the workers launch the rest as slots free."""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy.orm import Session

from backend import crud, permissions, quotas
from backend.core.config import Settings
from backend.core.identity import Principal
from backend.errors import Conflict, Forbidden, Invalid
from backend.models import FINISHED, Sweep
from backend.services import placement
from backend.services import runs as run_service
from backend.services.sweep_body import member_body, parse
from jobs.spec import JobSpec, SpecError, parse_spec, to_dict
from jobs.theory import predict
from jobs.theory.advisor import evaluate_spec
from paralab_core.queue import enqueue_run

log = logging.getLogger(__name__)


def predicted(spec: JobSpec, cluster: dict | None = None) -> dict | None:
    """The theory's figures the sweep page sets against the measured ones (jobs.theory.predict:
    the one model), None for kinds it does not model. With the advisor's `cluster` (a sweep
    launched from /advise), also its step-time breakdown at those bandwidths and compute rate
    (jobs.theory.advisor.evaluate_spec): what the page's calibration re-states."""
    if spec.kind != "train":
        return None
    try:
        p = predict(spec)
        out = {"peak_memory_bytes": p["memory"]["per_rank_bytes"],
               "comm_bytes_per_rank": p["comm"]["bytes_per_rank"],
               "bubble_fraction": (p["pipeline"]["bubble_fraction"] if spec.parallel.pp > 1
                                   else None),
               "step_time_s": p["step"]["time_no_overlap_s"],
               "step_time_full_overlap_s": p["step"]["time_full_overlap_s"]}
        if cluster:
            out.update(evaluate_spec(to_dict(spec), cluster),
                       **{k: float(v) for k, v in cluster.items()})
    except Exception:  # noqa: BLE001 - a theory gap must not refuse a valid run
        log.warning("theory prediction failed for a sweep member", exc_info=True)
        return None
    return out


def _check_member(db: Session, settings: Settings, body: dict, user: Principal | None,
                  force: bool) -> tuple[JobSpec | None, list[dict] | None]:
    """(spec, None) or (None, the 422 detail POST /api/runs would answer for this body)."""
    try:
        spec = parse_spec(body, max_world_size=settings.max_world_size, require_available=True)
    except SpecError as exc:
        return None, [{**e, "loc": ["body", *e["loc"]]} for e in exc.errors]
    errors = run_service.spec_errors(db, settings, spec, user)
    if not errors and user is not None:
        try:
            permissions.check_world_size(user, spec.world_size)
        except Forbidden as exc:
            errors = [{"loc": ["body", "parallel"], "msg": str(exc), "type": "user_limit"}]
    if not errors and not force and (refusal := run_service.memory_gate(db, settings, spec)):
        errors = [refusal]
    return (None, errors) if errors else (spec, None)


def _expand(db: Session, settings: Settings, body: Any, user: Principal | None, force: bool):
    """(name, base, grid, tags, notes, [(overrides, spec, errors, predicted)]): every check
    of a submission but the quotas. Invalid (422) on a broken rule or when no member is
    valid (each member's errors under ["body", "members", i, ...])."""
    if user is not None:
        permissions.require_submit(user)
    body = dict(body) if isinstance(body, dict) else body
    name, base, grid, overrides, queue = parse(body)
    cluster = body.get("cluster")
    tags, notes, errors = run_service.run_meta(body)
    if errors:
        raise Invalid(errors=errors)
    members = []
    for o in overrides:
        spec, errs = _check_member(db, settings, member_body(name, base, o, queue), user, force)
        members.append((o, spec, errs, predicted(spec, cluster) if spec else None))
    if not any(spec is not None for _, spec, _, _ in members):
        raise Invalid(errors=[{**e, "loc": ["body", "members", i, *e["loc"][1:]]}
                              for i, (_, _, errs, _) in enumerate(members) for e in errs])
    return name, base, grid, tags, notes, members


def validate(db: Session, settings: Settings, body: Any, *, owner: str | Principal,
             force: bool = False) -> dict:
    """What submit would answer, stored nowhere (the sweep builder's check before launch):
    the same 422 / 403 refusals, else each member's overrides and errors and the counts."""
    user = owner if isinstance(owner, Principal) else None
    _, _, _, _, _, members = _expand(db, settings, body, user, force)
    try:
        quotas.check_submit(db, settings, user, [s for _, s, _, _ in members if s is not None])
    finally:
        db.rollback()
    return {"members": len(members), "valid": sum(s is not None for _, s, _, _ in members),
            "items": [{"index": i, "overrides": o, "errors": errs, "predicted": pred}
                      for i, (o, _, errs, pred) in enumerate(members)]}


def submit(db: Session, settings: Settings, body: Any, *, owner: str | Principal,
           force: bool = False, client: str | None = None) -> Sweep:
    """Invalid (422) when the body breaks a rule or no member is valid (each member's errors
    under ["body", "members", i, ...]); nothing is stored then. Otherwise the sweep, with the
    invalid members kept with their errors."""
    user = owner if isinstance(owner, Principal) else None
    owner = user.username if user else owner
    name, base, grid, tags, notes, members = _expand(db, settings, body, user, force)
    valid = [spec for _, spec, _, _ in members if spec is not None]
    if quotas.needs_lock(db, settings, user):
        run_service.lock_for_limit(db)
    try:  # every valid member counts: the sweep is refused whole, nothing stored
        quotas.check_submit(db, settings, user, valid)
        sweep = crud.create_sweep(db, name=name, owner=owner, base=base, grid=grid,
                                  tags=tags, notes=notes, members=members)  # commit: unlock
    except Exception:
        db.rollback()
        raise
    _publish(db, settings, sweep)
    crud.audit(db, owner, "sweep.submit", sweep.id, {"name": sweep.name, "members":
                                                     len(members), "runs": len(valid)}, client)
    return sweep


def _publish(db: Session, settings: Settings, sweep: Sweep) -> None:
    """One message per one-host member run; gang placement for multi-host ones. A refused
    message leaves its run queued: the reconciler publishes it again (the sweep is stored)."""
    runs = [m.run for m in sweep.members if m.run is not None]
    for run in runs:
        if run.nnodes > 1:
            continue
        try:
            enqueue_run(settings, run.id, run.queue)
        except Exception:  # noqa: BLE001 - see the docstring
            log.exception("enqueue of sweep %s member run %s failed; the reconciler retries",
                          sweep.id, run.id)
    if any(r.nnodes > 1 for r in runs):
        try:
            placement.place_waiting(db, settings)
        except Exception:  # noqa: BLE001 - they stay queued: the reconciler places them
            db.rollback()
            log.exception("placement after the submission of sweep %s failed", sweep.id)


def cancel(db: Session, settings: Settings, sweep: Sweep, *, actor: Principal,
           client: str | None = None) -> Sweep:
    """Cancel every queued member run, then every running one (queued first: none of them can
    start in the slot a cancelled running member frees), through the run cancel path.
    Conflict when no member is queued or running."""
    permissions.require_modify_sweep(actor, sweep, "cancel")
    active = [m.run for m in sweep.members if m.run is not None and m.run.status not in FINISHED]
    if not active:
        raise Conflict(f"sweep {sweep.id} has no queued or running member")
    active.sort(key=lambda r: r.status != "queued")
    for run in active:
        try:
            run_service.cancel(db, settings, run)
        except Conflict:  # it finished meanwhile
            db.rollback()
    crud.audit(db, actor.username, "sweep.cancel", sweep.id,
               {"owner": sweep.owner, "runs": [r.id for r in active]}, client)
    db.expire_all()
    return crud.get_sweep(db, sweep.id)
