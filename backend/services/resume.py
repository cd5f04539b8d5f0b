"""Resume: a new run that continues an earlier run from one of its complete checkpoints.

A checkpoint is complete when every rank's shard of that step is written and rank 0's commit
marker exists (jobs/ckpt_index.py, docs/checkpoints.md); only those are listed or accepted.
`resume.run_id` / `resume.step` in a spec are checked here at submit, whichever way the spec
arrives (POST /api/runs, POST /api/runs/{id}/resume, the CLI): the parent exists and has
finished, the checkpoint is complete, and it can be loaded into the new layout."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from backend import crud
from backend.core.config import Settings
from backend.errors import Invalid, NotFound
from backend.models import FINISHED, Run
from jobs.ckpt_index import complete_checkpoints, resume_problem
from jobs.spec import JobSpec, deep_merge

# what a resume request may change over the parent's spec (the model and the optimizer must
# stay what the checkpoint holds: resume_problem says so when they do not)
OVERRIDABLE = ("name", "parallel", "runtime", "train", "faults")


def checkpoints(settings: Settings, run: Run) -> list[dict]:
    """The run's complete checkpoints, oldest first, without storage paths."""
    return [{k: v for k, v in c.items() if k != "path"}
            for c in complete_checkpoints(settings.runs_dir / run.id)]


def check(db: Session, settings: Settings, spec: JobSpec) -> list[dict]:
    """Why `spec.resume` cannot be honoured ([] when it can), as 422 error entries."""
    rid, step = spec.resume.run_id, spec.resume.step
    if not rid:
        return []
    parent = crud.get_run(db, rid)
    if parent is None:
        return [{"loc": ["body", "resume", "run_id"], "msg": f"no run {rid!r}",
                 "type": "not_found"}]
    if parent.status not in FINISHED:
        return [{"loc": ["body", "resume", "run_id"], "type": "value_error",
                 "msg": f"run {rid} is {parent.status}: resume from a finished run"}]
    found = {c["step"]: c for c in checkpoints(settings, parent)}
    if step not in found:
        have = ", ".join(map(str, sorted(found))) or "none"
        return [{"loc": ["body", "resume", "step"], "type": "value_error",
                 "msg": f"run {rid} has no complete checkpoint at step {step} (complete "
                        f"checkpoints: {have}; a checkpoint without every rank's shard and "
                        "its commit marker is never loaded)"}]
    if problem := resume_problem(found[step], spec.to_dict()):
        return [{"loc": ["body", "resume"], "msg": problem, "type": "reshard"}]
    return []


def resume_body(settings: Settings, parent: Run, req: dict[str, Any]) -> dict:
    """The spec body of a run continuing `parent`: its spec, the request's overrides of
    OVERRIDABLE sections merged over it, and resume = {parent, step} (default: the latest
    complete checkpoint). Tags and notes pass through for services.submit."""
    req = dict(req)
    extra = {k: req.pop(k) for k in ("tags", "notes") if k in req}
    step = req.pop("step", None)
    bad = [k for k in req if k not in OVERRIDABLE]
    if bad:
        raise Invalid(errors=[{"loc": ["body", k], "type": "extra_forbidden",
                               "msg": f"a resume may change only {', '.join(OVERRIDABLE)} "
                                      "(the model and optimizer are the checkpoint's)"}
                              for k in bad])
    if parent.kind != "train":
        raise Invalid(f"run: {parent.id} is a {parent.kind} job; only train runs checkpoint",
                      field="run")
    if step is None:
        have = checkpoints(settings, parent)
        if not have:
            raise NotFound(f"run {parent.id} has no complete checkpoint to resume from "
                           "(train.checkpoint_every was 0, or no save finished)")
        step = have[-1]["step"]
    # the parent's injected faults stay with the parent: a resume continues the training
    body = deep_merge({k: v for k, v in parent.spec.items() if k not in ("resume", "faults")},
                      req)
    body.setdefault("name", parent.spec.get("name", "run"))
    if "name" not in req:
        body["name"] = f"{body['name'][:160]} (resumed at {step})"
    body["resume"] = {"run_id": parent.id, "step": step}
    return {**body, **extra}
