"""Response shapes. Request bodies for runs are the job spec itself (validated by jobs.spec)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from backend.models import Run


class RunOut(BaseModel):
    id: str
    name: str
    owner: str
    kind: str
    strategy: str
    status: str
    world_size: int
    dp: int
    tp: int
    pp: int
    queue: str
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    heartbeat_at: datetime | None
    cancel_requested: bool
    worker_host: str | None
    exit_code: int | None
    error: str | None
    tags: list[str]
    notes: str
    metrics: dict[str, Any] | None = None
    # the sortable key figures (models.METRIC_COLUMNS), null until the run reports its analysis
    step_time_s: float | None = None
    tokens_per_s: float | None = None
    peak_memory_bytes: int | None = None
    exposed_comm_s: float | None = None
    bubble_fraction: float | None = None
    overlap_pct: float | None = None
    final_loss: float | None = None
    duration_s: float | None = None
    spec: dict[str, Any] | None = None
    summary: dict[str, Any] | None = None
    provenance: dict[str, Any] | None = None

    @classmethod
    def of(cls, run: Run, *, full: bool = True) -> RunOut:
        # List pages defer the heavy JSON columns (crud.list_runs): never touch them there.
        skip = {"tags"} | (set() if full else {"spec", "summary", "provenance"})
        data = {k: getattr(run, k) for k in cls.model_fields
                if k not in skip and k in Run.__mapper__.attrs}
        data["tags"] = [t.tag for t in run.tags]
        return cls(**data)


class RunPage(BaseModel):
    items: list[RunOut]
    next_cursor: str | None = Field(None, description="pass as ?cursor= for the next page")


class FileOut(BaseModel):
    path: str
    size: int
    sha256: str
    created_at: datetime


class ClaimIn(BaseModel):
    worker: str = Field(max_length=200)
    task_id: str | None = Field(None, max_length=200)


class LogLine(BaseModel):
    seq: int = Field(ge=0)
    ts: str | None = None
    line: str = Field(max_length=65536)


class LogBatch(BaseModel):
    lines: list[LogLine] = Field(max_length=10000)


class FinishIn(BaseModel):
    status: str = Field(pattern="^(succeeded|failed|cancelled|timed_out)$")
    exit_code: int | None = None
    error: str | None = Field(None, max_length=200_000)
    summary: dict[str, Any] | None = None
    provenance: dict[str, Any] | None = None


class WorkerIn(BaseModel):
    name: str = Field(max_length=200)
    host: str = Field(max_length=200)
    queue: str = Field(max_length=64)
    slots: int = Field(ge=0)
    busy: int = Field(ge=0)
    devices: list[dict[str, Any]] = []
    info: dict[str, Any] = {}


class WorkerOut(WorkerIn):
    free: int
    last_seen: datetime
