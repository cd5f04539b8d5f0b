"""POST /api/predict: the theory model for a job spec or a what-if, every figure with its
formula, inputs and convention (jobs/theory); for a train spec also `trace`, the predicted
trace size of its `trace` section (jobs.trace_schedule.predicted_trace)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Request

from backend.api.deps import CheckedParams, SettingsDep, UserDep
from backend.api.schemas import json_problems
from backend.errors import Invalid
from backend.services.advise import cache_bytes
from backend.services.request_limits import limits_of
from jobs.spec import SpecError, parse_spec
from jobs.theory import predict as theory_predict
from jobs.theory.advisor import configure_caches
from jobs.trace_schedule import predicted_trace

router = APIRouter(prefix="/api", tags=["predict"], dependencies=[CheckedParams])

_EXAMPLES = [
    {"params": 7.5e9, "dp": 64, "tp": 1, "pp": 1, "zero_stage": 1, "memory_model": "16psi"},
    {"preset": "zero2"},
    {"spec": {"preset": "pp-1f1b"}, "assumptions": {"bandwidth_GBps": 25, "compute_ms": 400}},
]


def run_predict(body: dict[str, Any]) -> dict:
    """what-if (has `params`), `{"spec": ..., "assumptions": {...}}`, or a spec / preset."""
    if problems := json_problems(body):  # the theory takes numbers as they come: NaN too
        raise Invalid(errors=[{"loc": ["body", *loc], "msg": rule, "type": "value_error"}
                              for loc, rule in problems])
    prefix: list = ["body"]
    try:
        if "spec" in body and "params" not in body:
            extra = set(body) - {"spec", "assumptions"}
            if extra:
                raise SpecError([{"loc": [sorted(extra)[0]], "msg": "unknown field; allowed: "
                                  "spec, assumptions", "type": "extra_forbidden"}])
            assumptions = body.get("assumptions") or {}
            if not isinstance(assumptions, dict):
                raise SpecError([{"loc": ["assumptions"], "msg": "must be an object",
                                  "type": "dict_type"}])
            prefix = ["body", "spec"]
            return _with_trace(theory_predict(body["spec"], **assumptions), body["spec"])
        out = theory_predict(body)
        return out if "params" in body else _with_trace(out, body)
    except SpecError as exc:
        assumed = set(body.get("assumptions") or {}) if prefix[-1] == "spec" else set()
        raise Invalid(errors=[
            {**e, "loc": (["body", "assumptions"] if e["loc"] and e["loc"][0] in assumed
                          else prefix) + list(e["loc"])} for e in exc.errors]) from exc
    except TypeError as exc:  # an unknown assumption keyword
        raise Invalid(str(exc), field="assumptions") from exc


def _with_trace(out: dict, spec_body) -> dict:
    """The theory's answer plus the trace size a train spec's `trace` section predicts (the
    spec parsed already inside the theory: this parse cannot fail)."""
    spec = parse_spec(spec_body, max_world_size=1 << 30)
    return {**out, "trace": predicted_trace(spec)} if spec.kind == "train" else out


@router.post("/predict")
def predict(body: Annotated[dict[str, Any], Body(examples=_EXAMPLES)], user: UserDep,
            settings: SettingsDep, request: Request) -> dict:
    """Bounded work: every integer has its bound (the spec's, or the what-if's), the schedule
    simulator at most jobs.theory.predict.MAX_SIM_ACTIONS actions; counted against the
    user's rate limit (429 with Retry-After; a 422 is not counted)."""
    configure_caches(cache_bytes(settings))
    with limits_of(request.app).counted("compute", user.username):
        out = run_predict(body)
        if problems := json_problems(out):  # finite inputs so large that a figure overflows
            loc, _ = problems[0]
            raise Invalid(errors=[{"loc": ["body"], "type": "value_error", "msg": "inputs "
                                   f"too large: the predicted {'.'.join(map(str, loc))} "
                                   "overflows (is not a finite number)"}])
    return out
