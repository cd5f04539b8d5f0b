"""Every /api/runs/... route: the runs themselves (crud.py) and each sub-resource in a module of
its own (stars, logs, streams, files, notes, analysis). main.py includes `router` only."""

from fastapi import APIRouter

from backend.api.deps import CheckedParams
from backend.api.routes.runs import analysis, crud, files, logs, notes, resume, stars, streams

router = APIRouter()
for _module in (crud, resume, stars, logs, streams, files, notes, analysis):
    router.include_router(_module.router, dependencies=[CheckedParams])  # the text rule
