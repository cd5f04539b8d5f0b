"""The pipeline schedule explorer's API (issue 4): the pure schedule of any configuration, from
the torch-free simulator `jobs.schedules`, without compute noise.

Auth is the app's default (AuthMiddleware): open in local mode, credentials in team mode, as
GET /api/presets."""

from __future__ import annotations

from fastapi import APIRouter, Query, Request

from backend.api.deps import CheckedParams, UserDep
from backend.errors import Invalid
from backend.services.request_limits import limits_of
from jobs import schedules as sched

router = APIRouter(prefix="/api/schedules", tags=["schedules"], dependencies=[CheckedParams])

# Work bound: the simulator runs every (rank, chunk, micro-batch) of p*v*m, i.e. 2 or 3 actions
# each (F + BW, or F + B + W): at most 60000 spans, a few MB of JSON, ~1 s of CPU.
MAX_PVM = 20000
LIMITS = {"p": (1, 64), "m": (1, 512), "v": (1, 16)}
TIME_MAX = 1e6
DEFAULTS = {"schedule": "1f1b", "p": 4, "m": 8, "v": 1, "t_f": 1.0, "t_b_input": 1.0,
            "t_b_weight": 1.0, "t_comm": 0.0}


# a GET that can be throttled declares it (backend/main.py declares 429 for writes only)
THROTTLED = {429: {"description": "Over the user's rate limit (docs/security.md \"Limits\"); "
                                  "see Retry-After",
                   "content": {"application/json": {
                       "schema": {"$ref": "#/components/schemas/Error"}}}}}


def _error(field: str, msg: str) -> Invalid:
    return Invalid(msg, field=field, where="query")


def _time(default: float, doc: str):
    return Query(default, ge=0, le=TIME_MAX, allow_inf_nan=False, description=doc)


@router.get("")
def schedules() -> dict:
    """What the explorer accepts: the schedules, their placement, bounds and defaults."""
    return {"schedules": list(sched.SCHEDULES), "split_backward": list(sched.SPLIT_BACKWARD),
            "placements": {s: sched.placement_of(s) for s in sched.SCHEDULES},
            "kinds": list(sched.KINDS),
            "limits": {**{k: {"min": lo, "max": hi} for k, (lo, hi) in LIMITS.items()},
                       "p*v*m": {"max": MAX_PVM}, "times": {"min": 0, "max": TIME_MAX}},
            "defaults": DEFAULTS, "convention": sched.CONVENTION}


@router.get("/explore", responses=THROTTLED)
def explore(
    request: Request,
    user: UserDep,
    schedule: str = Query(..., description=f"one of {', '.join(sched.SCHEDULES)}",
                          json_schema_extra={"enum": list(sched.SCHEDULES)}),
    p: int = Query(..., ge=LIMITS["p"][0], le=LIMITS["p"][1], description="pipeline ranks"),
    m: int = Query(..., ge=LIMITS["m"][0], le=LIMITS["m"][1], description="micro-batches"),
    v: int = Query(1, ge=LIMITS["v"][0], le=LIMITS["v"][1],
                   description="virtual stages (model chunks) per rank: >1 only for "
                               "interleaved, exactly 2 for zbv"),
    t_f: float = _time(1.0, "forward time of one model stage (relative units)"),
    t_b_input: float = _time(1.0, "input-gradient backward time of one stage"),
    t_b_weight: float = _time(1.0, "weight-gradient backward time of one stage "
                                                 "(a full BW takes t_b_input + t_b_weight)"),
    t_comm: float = _time(0.0, "added to every dependency that crosses ranks"),
) -> dict:
    """The simulated schedule: `jobs.schedules.simulate` (spans per rank, idle fractions,
    makespan, bubble fractions, closed form, convention) plus the per-rank action lists,
    the stage placement and the global stages each rank holds."""
    try:
        sched.check(schedule, p, m, v)  # the simulator's rules, before its work is bounded
        if p * v * m > MAX_PVM:
            raise sched.ScheduleError("m", f"p*v*m must be <= {MAX_PVM} (the explorer "
                                           "simulates every rank, chunk and micro-batch), got "
                                           f"{p}*{v}*{m} = {p * v * m}")
        # valid: counted against the user's rate limit (429 with Retry-After)
        limits_of(request.app).charge("compute", user.username)
        out = sched.simulate(schedule, p, m, v, t_f=t_f, t_b_input=t_b_input,
                             t_b_weight=t_b_weight, t_comm=t_comm)
    except sched.ScheduleError as exc:
        raise _error(exc.field, str(exc)) from exc
    placement = sched.placement_of(schedule)
    out["placement"] = placement
    out["split_backward"] = schedule in sched.SPLIT_BACKWARD
    out["actions"] = [[str(a) for a in acts]
                      for acts in sched.schedule_actions(schedule, p, m, v)]
    for rank in out["ranks"]:
        rank["stages"] = [sched.stage_of(rank["rank"], c, p, v, placement) for c in range(v)]
    return out
