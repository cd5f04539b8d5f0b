"""Health, workers, presets and the spec's field documentation."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from sqlalchemy import text

from backend import crud
from backend.api.deps import DbDep, SettingsDep
from backend.api.schemas import WorkerOut
from backend.migrate import schema_behind
from backend.services import health as health_checks
from jobs.faultspec import EXAMPLES as FAULT_EXAMPLES
from jobs.spec import SPEC_VERSION, field_docs, presets_table
from paralab_core.queue import broker_ok

router = APIRouter(prefix="/api", tags=["meta"])


@router.get("/health/live")
def live() -> dict:
    return {"ok": True}


@router.get("/health")
def health(db: DbDep, settings: SettingsDep) -> JSONResponse:
    """200 with status "ok" or "degraded" (with `problems`, in words); 503 "down" when the
    database or the broker does not answer, or the database is not migrated."""
    checks: dict[str, dict] = {}
    problems: list[str] = []
    try:
        db.execute(text("SELECT 1"))
        checks["database"] = {"ok": True, "url": settings.db_url.split("@")[-1]}
        # answering is not enough: a `paralab serve` on a database nobody migrated has no
        # tables, and every other route would fail
        if behind := schema_behind(settings.db_url):
            checks["database"] = {"ok": False, "url": checks["database"]["url"],
                                  "error": behind}
            problems.append(behind)
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        checks["database"] = {"ok": False, "error": str(exc)}
        problems.append(f"the database does not answer: {exc}")
    ok, detail = broker_ok(settings)
    checks["broker"] = {"ok": ok, "url": settings.broker_url.split("@")[-1], "detail": detail}
    if not ok:
        problems.append(f"the job queue (broker) does not answer: {detail}")
    if checks["database"]["ok"]:
        found, said = health_checks.worker_checks(db, settings)
        checks.update(found)
        problems += said
    checks["disk"], said = health_checks.disk_check(settings.data_dir,
                                                    settings.disk_min_free_bytes)
    problems += said
    checks["memory"] = health_checks.memory_check()
    up = checks["database"]["ok"] and checks["broker"]["ok"]
    status = "down" if not up else ("degraded" if problems else "ok")
    return JSONResponse({"ok": status == "ok", "status": status, "problems": problems,
                         "checks": checks}, status_code=200 if up else 503)


@router.get("/workers", response_model=list[WorkerOut])
def workers(db: DbDep, settings: SettingsDep) -> list[WorkerOut]:
    rows = crud.list_workers(db, seen_within_s=settings.worker_alive_s)
    return [WorkerOut(name=w.name, host=w.host, queue=w.queue, slots=w.slots, busy=w.busy,
                      free=max(w.slots - w.busy, 0), devices=w.devices, info=w.info,
                      last_seen=w.last_seen) for w in rows]


@router.get("/presets")
def presets() -> list[dict]:
    return presets_table()


@router.get("/spec")
def spec_fields(settings: SettingsDep) -> dict:
    return {"version": SPEC_VERSION, "fields": field_docs(),
            "max_world_size": settings.max_world_size,
            # one-click faults for the new-run form (jobs/faultspec.py, docs/faults.md)
            "fault_examples": FAULT_EXAMPLES}
