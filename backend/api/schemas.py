"""Response shapes, the worker channel's bodies, and the input rules every request body
shares: `SafeStr` (jobs.spec.text_problem), finite floats (`Input`), bounded integers, and
`WorkerJson` for what workers report (stored, never refused). Request bodies for runs are the
job spec itself (validated by jobs.spec)."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Annotated, Any

from fastapi import Path
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, field_validator

from backend.models import Run
from backend.storage import FILE_PATH_PATTERN
from jobs.spec import number_problem, text_problem

# Integer columns: a bound on every integer a client sends, so that none overflows the
# database's integer (SQLite and PostgreSQL BIGINT: 64 bits; INTEGER on PostgreSQL: 32).
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
# Free-form JSON (summaries, what-if bodies): how deep objects and arrays may nest.
MAX_JSON_DEPTH = 64
NESTING_RULE = (f"JSON nested too deeply: objects and arrays may nest at most {MAX_JSON_DEPTH} "
                "levels")


def _safe(value: str) -> str:
    if problem := text_problem(value):
        raise ValueError(problem)
    return value


# The schema states the rule too (what a client may send), the validator enforces it
TEXT_PATTERN = "^[^\\u0000\\uD800-\\uDFFF]*$"
SafeStr = Annotated[str, AfterValidator(_safe),
                    Field(json_schema_extra={"pattern": TEXT_PATTERN})]


def _json_integer(value: Any) -> Any:
    """A JSON Schema integer: a number with no fraction (1.0 included), never true or "1"
    (pydantic's lax mode would coerce those; the schema says integer)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("must be an integer (a JSON number without a fraction)")
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError("must be an integer (a JSON number without a fraction)")
        return int(value)
    return value


JsonInt = Annotated[int, BeforeValidator(_json_integer)]
# A process's exit code as the runs table holds it (an INTEGER). The bounds go before JsonInt's
# validator: after it, or as Field(ge=, le=) on `JsonInt | None`, pydantic writes them into the
# schema as the unknown keywords `ge` / `le`, and the schema said nothing (issue 36, item 9).
ExitCode = Annotated[int, Field(ge=-(2**31), le=2**31 - 1), *JsonInt.__metadata__]


def json_problems(value: Any, loc: tuple = (), depth: int = 0) -> list[tuple[tuple, str]]:
    """(where, rule) for each part of free-form JSON that breaks an input rule: text (keys
    too), finite numbers, nesting depth."""
    if depth > MAX_JSON_DEPTH:
        return [(loc, NESTING_RULE)]
    if isinstance(value, str):
        return [(loc, p)] if (p := text_problem(value)) else []
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:  # an integer beyond every float is as infinite as Infinity
            p = number_problem(float(value))
        except OverflowError:
            p = number_problem(math.inf)
        return [(loc, p)] if p else []
    out: list[tuple[tuple, str]] = []
    if isinstance(value, dict):
        for k, v in value.items():
            if isinstance(k, str) and (p := text_problem(k)):
                out.append(((*loc, "(key)"), p))
            out += json_problems(v, (*loc, k), depth + 1)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += json_problems(v, (*loc, i), depth + 1)
    return out


def printable(value: str) -> str:
    """Text a job printed, stored as it came except what no database can hold the same way:
    NUL becomes U+FFFD, a lone surrogate its escape. (A log line is never refused: it would
    be lost.)"""
    if text_problem(value) is None:
        return value
    return value.replace("\x00", "\ufffd").encode("utf-8", "backslashreplace").decode("utf-8")


def storable(value: Any, depth: int = 0) -> Any:
    """What a worker reports (summaries, provenance, device and host info) made storable the
    same way on both databases instead of refused, as log lines are: refusing it would lose
    the run's report. Text (keys too) through `printable`; a non-finite number (Python's JSON
    parser reads NaN) becomes null."""
    if depth > MAX_JSON_DEPTH:
        raise ValueError(NESTING_RULE)
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > INT64_MAX:
        return None  # beyond what JSON readers hold exactly (and SQLite's JSON integers)
    if isinstance(value, dict):
        return {printable(str(k)): storable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [storable(v, depth + 1) for v in value]
    return value


# The worker channel's free-form JSON: stored, never refused (see `storable`).
WorkerJson = Annotated[dict[str, Any], AfterValidator(storable)]


class Input(BaseModel):
    """Base of every request body: NaN and Infinity are refused in float fields."""

    model_config = ConfigDict(allow_inf_nan=False)


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
    ep: int = 1
    cp: int = 1
    queue: str
    nnodes: int = 1
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
    parent_id: str | None = None

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


# A run file's path in the URL (GET / PUT .../files/{path}): the schema states
# storage.resolve_run_path's rule, which the route enforces (400, not a 422: the rule is the
# storage's). Documented only, hence json_schema_extra.
RunFilePath = Annotated[str, Path(
    description="relative to the run's folder, e.g. trace-rank0.jsonl",
    json_schema_extra={"pattern": FILE_PATH_PATTERN})]

# An upload's content address in the URL (GET /api/uploads/{sha256}, the worker channel's
# copy): the schema states the rule the service checks (backend/services/uploads.check_sha)
Sha256Path = Annotated[str, Path(
    description="the upload's SHA-256, 64 lower-case hexadecimal digits",
    pattern="^[0-9a-f]{64}$")]

# A run file as GET .../files/{path} answers it: its bytes, with the media type its name
# implies (JSON, text, Parquet, ...): declared as any type, not the JSON FastAPI assumes.
FILE_RESPONSES = {200: {"description": "the file's bytes; the media type its name implies",
                        "content": {"*/*": {"schema": {"type": "string", "format": "binary"}}}}}


class ClaimIn(Input):
    worker: SafeStr = Field(max_length=200)
    task_id: SafeStr | None = Field(None, max_length=200)


class LogLine(Input):
    seq: JsonInt = Field(ge=0, le=INT32_MAX)  # run_logs.seq is an INTEGER
    ts: str | None = Field(None, max_length=64, description="ISO 8601, when the line was "
                           "written; a time that cannot be read or stored is replaced by the "
                           "time the line arrived, and named in the answer's `rejected`")
    line: str = Field(max_length=65536)

    @field_validator("line")
    @classmethod
    def _printable(cls, v: str) -> str:
        return printable(v)


class LogBatch(Input):
    lines: list[LogLine] = Field(max_length=10000)


class LineProblem(BaseModel):
    loc: list[str | int] = Field(description='e.g. ["body", "lines", 3, "ts"]')
    msg: str


class LogBatchOut(BaseModel):
    """The answer to a log batch: it is never refused for what one line holds (the line, or
    the rest of the batch, would be lost, and the worker would resend it for nothing)."""

    added: int = Field(description="lines stored now (those of a retried batch the backend "
                                   "already had are not counted)")
    rejected: list[LineProblem] | None = Field(
        None, description="what of the added lines could not be stored as sent, and what was "
                          "stored instead (absent: nothing); final, the worker does not resend")


class FinishIn(Input):
    status: str = Field(pattern="^(succeeded|failed|cancelled|timed_out|hung)$")
    exit_code: ExitCode | None = None
    error: str | None = Field(None, max_length=200_000)
    summary: WorkerJson | None = None
    provenance: WorkerJson | None = None

    @field_validator("error")
    @classmethod
    def _printable(cls, v: str | None) -> str | None:
        return None if v is None else printable(v)  # the job's stderr: kept, made storable


class WorkerIn(Input):
    name: SafeStr = Field(max_length=200)
    host: SafeStr = Field(max_length=200)
    queue: SafeStr = Field(max_length=64)
    # JsonInt: the schema says integer, so "3" and true are refused, not coerced
    slots: JsonInt = Field(ge=0, le=INT32_MAX)
    busy: JsonInt = Field(ge=0, le=INT32_MAX)
    devices: list[WorkerJson] = []
    info: WorkerJson = {}


class WorkerOut(WorkerIn):
    free: int
    last_seen: datetime
