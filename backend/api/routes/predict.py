"""POST /api/predict: the theory model for a job spec or a what-if, every figure with its
formula, inputs and convention (jobs/theory)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body

from backend.api.deps import CheckedParams
from backend.api.schemas import json_problems
from backend.errors import Invalid
from jobs.spec import SpecError
from jobs.theory import predict as theory_predict

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
            return theory_predict(body["spec"], **assumptions)
        return theory_predict(body)
    except SpecError as exc:
        assumed = set(body.get("assumptions") or {}) if prefix[-1] == "spec" else set()
        raise Invalid(errors=[
            {**e, "loc": (["body", "assumptions"] if e["loc"] and e["loc"][0] in assumed
                          else prefix) + list(e["loc"])} for e in exc.errors]) from exc
    except TypeError as exc:  # an unknown assumption keyword
        raise Invalid(str(exc), field="assumptions") from exc


@router.post("/predict")
def predict(body: Annotated[dict[str, Any], Body(examples=_EXAMPLES)]) -> dict:
    out = run_predict(body)
    if problems := json_problems(out):  # finite inputs so large that a figure overflows
        loc, _ = problems[0]
        raise Invalid(errors=[{"loc": ["body"], "type": "value_error", "msg": "inputs too "
                               f"large: the predicted {'.'.join(map(str, loc))} overflows (is "
                               "not a finite number)"}])
    return out
