"""Runs: validate, gate on predicted memory, store, enqueue; cancel."""

from __future__ import annotations

import logging
import shutil
from typing import Any

from sqlalchemy.orm import Session

from backend import crud, permissions, quotas
from backend.core.config import Settings
from backend.core.identity import Principal
from backend.errors import Conflict, Invalid, Unavailable
from backend.models import FINISHED, Run, RunTag
from backend.services import placement, resume, uploads
from backend.streams import hub
from jobs.spec import JobSpec, SpecError, parse_spec, text_problem
from jobs.theory import predict
from paralab_core.queue import enqueue_run, revoke_run

log = logging.getLogger(__name__)

_TAG_RULE = "tags: must be a list of at most 20 strings of 1-64 characters"


def run_meta(body: dict[str, Any]) -> tuple[list[str], str, list[dict]]:
    errors = []
    tags = body.pop("tags", [])
    notes = body.pop("notes", "")
    if not isinstance(tags, list) or len(tags) > 20 or not all(
            isinstance(t, str) and 1 <= len(t.strip()) <= 64 for t in tags):
        errors.append({"loc": ["body", "tags"], "msg": _TAG_RULE, "type": "value_error"})
        tags = []
    for i, t in enumerate(tags):
        if problem := text_problem(t):
            errors.append({"loc": ["body", "tags", i], "msg": problem, "type": "string_unsafe"})
            tags = []
            break
    if not isinstance(notes, str) or len(notes) > 100_000:
        errors.append({"loc": ["body", "notes"], "msg": "must be a string of at most 100000 "
                       "characters", "type": "value_error"})
        notes = ""
    elif problem := text_problem(notes):
        errors.append({"loc": ["body", "notes"], "msg": problem, "type": "string_unsafe"})
        notes = ""
    return [t.strip() for t in tags], notes, errors


def memory_gate(db: Session, settings: Settings, spec: JobSpec) -> dict | None:
    """Refuse a spec whose predicted per-rank memory exceeds the device memory the workers of
    its queue report, with the numbers, instead of an OOM later. None when it fits (or when no
    worker of that queue has reported yet: nothing to compare with)."""
    workers = [w for w in crud.list_workers(db, seen_within_s=settings.worker_alive_s)
               if w.queue == spec.runtime.queue]
    capacities = [d.get("memory_bytes") for w in workers for d in w.devices
                  if d.get("memory_bytes")]
    if not capacities:
        return None
    capacity = min(capacities)
    if any(d.get("type") == "cpu" for w in workers for d in w.devices):
        # CPU ranks share their host's memory (nproc_per_node of them on each host).
        capacity = capacity // max(1, spec.runtime.nproc_per_node)
    pred = predict(spec)["memory"]
    need = pred["per_rank_bytes"]
    if need <= capacity:
        return None
    parts = ", ".join(f"{k} {v / 1e9:.3f} GB" for k, v in pred["components"].items())
    return {"loc": ["body"], "type": "memory_gate",
            "msg": f"predicted memory per rank {need / 1e9:.3f} GB ({parts}; memory model "
                   f"{pred['memory_model']}) exceeds the {capacity / 1e9:.3f} GB per rank the "
                   f"workers of queue {spec.runtime.queue!r} report; resubmit with "
                   "?force=true to run it anyway"}


def lock_for_limit(db: Session) -> None:
    """The concurrent-run limit counts the user's active runs, then adds one: two submissions
    at once must not both count the same number. On SQLite the transaction takes the write lock
    before it counts (BEGIN IMMEDIATE: the others wait, busy_timeout, then count again); on
    PostgreSQL quotas.check_submit locks the user's row (SELECT ... FOR UPDATE). The same for
    the slot-hours quota, which counts what the active runs reserve.
    Either lock lasts until create_run commits, or the rollback of a refusal."""
    if db.get_bind().dialect.name == "sqlite":
        db.commit()  # end the reads of this request: BEGIN cannot nest
        db.connection().exec_driver_sql("BEGIN IMMEDIATE")


def spec_errors(db: Session, settings: Settings, spec: JobSpec,
                user: Principal | None) -> list[dict]:
    """The submit rules past the spec's own, as 422 entries: a resume that can be honoured,
    hosts that could ever hold the run, the admin's timeout bounds. One list for a run and
    for each member of a sweep."""
    return (resume.check(db, settings, spec)
            + uploads.script_errors(db, spec)  # a script's working directory and entry
            + placement.submit_errors(db, settings, spec)  # hosts that can never hold it
            + quotas.spec_errors(settings, user, spec))  # the admin's timeout bounds


def submit(db: Session, settings: Settings, body: dict[str, Any], *,
           owner: str | Principal, force: bool = False, client: str | None = None) -> Run:
    """Validate, gate on predicted memory, store, then enqueue the run's ID. Nothing is stored
    when validation fails (Invalid); when the broker refuses the message, the run is removed
    (Unavailable).
    `owner` is the submitting Principal (its role and per-user limits are checked and the
    submission is audited) or, for callers without accounts, a bare username."""
    user = owner if isinstance(owner, Principal) else None
    owner = user.username if user else owner
    if user is not None:
        permissions.require_submit(user)
    body = dict(body)
    tags, notes, errors = run_meta(body)
    try:
        spec = parse_spec(body, max_world_size=settings.max_world_size, require_available=True)
    except SpecError as exc:
        errors += [{**e, "loc": ["body", *e["loc"]]} for e in exc.errors]
    else:
        errors += spec_errors(db, settings, spec, user)
    if errors:
        raise Invalid(errors=errors)
    if quotas.needs_lock(db, settings, user):
        lock_for_limit(db)
    try:
        quotas.check_submit(db, settings, user, [spec])
        if not force and (refusal := memory_gate(db, settings, spec)):
            raise Invalid(errors=[refusal])
        run = crud.create_run(db, spec, owner=owner, tags=tags, notes=notes)  # commit: unlock
    except Exception:
        db.rollback()  # a refusal ends the transaction, and with it the lock
        raise
    if run.nnodes > 1:  # gang placement: reserved all-or-nothing, one message per node
        try:
            placement.place_waiting(db, settings)
        except Exception:  # noqa: BLE001 - it stays queued: the reconciler places it
            db.rollback()
            log.exception("placement after the submission of run %s failed", run.id)
    else:
        _enqueue(db, settings, run)
    # a script run: who ran what code is its upload's hash and the entry (docs/security.md)
    code = {"script": {"upload": spec.script.upload, "entry": spec.script.entry}} \
        if spec.kind == "script" else {}
    crud.audit(db, owner, "run.submit", run.id, {"name": run.name, "strategy": run.strategy,
                                            "world_size": run.world_size, "queue": run.queue,
                                            **code, **({"force": True} if force else {})},
               client)
    return run


def _enqueue(db: Session, settings: Settings, run: Run) -> None:
    """Publish a one-host run's message; when the broker refuses it, the run is removed."""
    try:
        enqueue_run(settings, run.id, run.queue)
    except Exception as exc:
        log.exception("enqueue of run %s failed", run.id)
        crud.delete_run(db, run.id)
        raise Unavailable(f"the job queue is unavailable: {exc}") from exc


def edit(db: Session, run: Run, changes: dict, *, actor: str,
         client: str | None = None) -> Run:
    """Name, tags and notes, stored literally; the audit entry keeps name and tags before and
    after (notes can be long: only that they changed)."""
    before = {k: ([t.tag for t in run.tags] if k == "tags" else getattr(run, k))
              for k in changes}
    if "name" in changes:
        run.name = changes["name"]
    if "notes" in changes:
        run.notes = changes["notes"]
    if "tags" in changes:
        want = changes["tags"]
        for t in list(run.tags):
            if t.tag not in want:
                run.tags.remove(t)
        have = {t.tag for t in run.tags}
        run.tags.extend(RunTag(tag=t) for t in want if t not in have)
    detail = {"owner": run.owner, "fields": sorted(changes)}
    for k in ("tags", "name"):
        if k in changes:
            detail[k] = {"before": before[k], "after": changes[k]}
    crud.audit(db, actor, "run.edit", run.id, detail, client, commit=False)
    db.commit()
    db.refresh(run)
    return run


def delete(db: Session, settings: Settings, run: Run, *, actor: str,
           client: str | None = None) -> None:
    """Remove a finished run from the history, with its logs and files (Conflict while it is
    queued or running: its worker would write into a folder that no longer exists)."""
    if run.status not in FINISHED:
        raise Conflict(f"run {run.id} is {run.status}; cancel it first")
    run_id, detail = run.id, {"owner": run.owner, "name": run.name, "status": run.status}
    crud.audit(db, actor, "run.delete", run_id, detail, client)
    crud.delete_run(db, run_id)
    folder = (settings.runs_dir / run_id).resolve()
    if folder.parent == settings.runs_dir.resolve() and folder.is_dir():
        shutil.rmtree(folder, ignore_errors=True)


def cancel(db: Session, settings: Settings, run: Run, *, actor: str | None = None,
           client: str | None = None) -> Run:
    """Conflict when the run has already finished."""
    if run.status in FINISHED:
        raise Conflict(f"run {run.id} already {run.status}")
    was_queued = run.status == "queued"
    run = crud.request_cancel(db, run)
    hub.publish_status(run.id, run.status)  # a queued run is cancelled at once
    if actor is not None:
        crud.audit(db, actor, "run.cancel", run.id, {"owner": run.owner, "was": "queued" if
                                                was_queued else "running"}, client)
    if was_queued:
        try:
            revoke_run(settings, run.id)
        except Exception:  # the worker skips cancelled runs anyway; revoke is only tidiness
            log.warning("revoke of run %s failed", run.id, exc_info=True)
    return run
