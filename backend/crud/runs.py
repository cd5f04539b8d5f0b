"""Runs: create, list (filter, sort, cursor), cancel, claim, heartbeat, logs, files, finish,
reap. Routes and services call one function here and return."""

from __future__ import annotations

import base64
import json
import re
import secrets
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import and_, delete, func, or_, select, update
from sqlalchemy.orm import Session, defer

from backend.models import (
    FINISHED,
    METRIC_COLUMNS,
    Run,
    RunFile,
    RunLog,
    RunTag,
    metric_values,
    utcnow,
)
from jobs.spec import JobSpec

SORT_KEYS = {"created_at": Run.created_at, "name": Run.name, "status": Run.status,
             "strategy": Run.strategy, "world_size": Run.world_size,
             **{c: getattr(Run, c) for c in METRIC_COLUMNS}}
_RANK_PREFIX = re.compile(r"^\[(?:default|rank)(\d+)\]:")


def new_run_id() -> str:
    return secrets.token_hex(6)


def create_run(db: Session, spec: JobSpec, *, owner: str, tags: list[str], notes: str) -> Run:
    run = Run(id=new_run_id(), name=spec.name, owner=owner, kind=spec.kind,
              strategy=spec.strategy, spec=spec.to_dict(), spec_version=spec.version,
              world_size=spec.world_size, dp=spec.parallel.dp, tp=spec.parallel.tp,
              pp=spec.parallel.pp, queue=spec.runtime.queue, status="queued",
              created_at=utcnow(), cancel_requested=False, notes=notes,
              tags=[RunTag(tag=t) for t in dict.fromkeys(tags)])
    db.add(run)
    db.commit()
    return run


def delete_run(db: Session, run_id: str) -> None:
    db.execute(delete(Run).where(Run.id == run_id))
    db.commit()


def get_run(db: Session, run_id: str) -> Run | None:
    return db.get(Run, run_id)


@dataclass
class RunFilter:
    status: str | None = None
    strategy: str | None = None
    owner: str | None = None
    tag: str | None = None
    q: str | None = None
    # {metric column: (min, max)}, either end None: runs without the figure never match
    ranges: dict[str, tuple[float | None, float | None]] = field(default_factory=dict)


def _encode_cursor(value, run_id: str) -> str:
    if isinstance(value, datetime):
        value = {"dt": value.isoformat()}
    return base64.urlsafe_b64encode(json.dumps([value, run_id]).encode()).decode()


def decode_cursor(cursor: str) -> tuple:
    """Raises ValueError on a cursor this server did not produce."""
    try:
        value, run_id = json.loads(base64.urlsafe_b64decode(cursor.encode()))
    except Exception as exc:  # noqa: BLE001 - any malformed cursor is the same user error
        raise ValueError("cursor: not a cursor returned by this API") from exc
    if isinstance(value, dict) and "dt" in value:
        value = datetime.fromisoformat(value["dt"])
    if not isinstance(run_id, str):
        raise ValueError("cursor: not a cursor returned by this API")
    return value, run_id


def list_runs(db: Session, f: RunFilter, *, sort: str = "-created_at", cursor: str | None = None,
              limit: int = 50) -> tuple[list[Run], str | None]:
    desc = sort.startswith("-")
    key = sort.lstrip("-")
    if key not in SORT_KEYS:
        raise ValueError(f"sort: must be one of {', '.join(SORT_KEYS)} (prefix - for descending)")
    col = SORT_KEYS[key]
    # The list never shows specs, summaries or provenance: don't load them.
    stmt = select(Run).options(defer(Run.spec), defer(Run.summary), defer(Run.provenance))
    if f.status:
        stmt = stmt.where(Run.status.in_(f.status.split(",")))
    if f.strategy:
        stmt = stmt.where(Run.strategy.in_(f.strategy.split(",")))
    if f.owner:
        stmt = stmt.where(Run.owner == f.owner)
    if f.tag:
        stmt = stmt.where(Run.id.in_(select(RunTag.run_id).where(RunTag.tag == f.tag)))
    if f.q:
        like = f"%{f.q.lower().replace('%', '').replace('_', '')}%"
        stmt = stmt.where(or_(func.lower(Run.name).like(like), func.lower(Run.notes).like(like),
                              func.lower(Run.strategy).like(like), Run.id == f.q))
    for c, (lo, hi) in f.ranges.items():
        assert c in METRIC_COLUMNS, c
        col_f = getattr(Run, c)
        if lo is not None:
            stmt = stmt.where(col_f >= lo)
        if hi is not None:
            stmt = stmt.where(col_f <= hi)
    nullable = key in METRIC_COLUMNS  # runs without the figure come last, whatever the order
    value, last_id = decode_cursor(cursor) if cursor else (_START, None)
    rows: list[Run] = []
    if value is not None:  # the runs that have the figure (or every run: non-null keys)
        q = stmt.where(col.is_not(None)) if nullable else stmt
        if value is not _START:
            if desc:
                q = q.where(or_(col < value, and_(col == value, Run.id < last_id)))
            else:
                q = q.where(or_(col > value, and_(col == value, Run.id > last_id)))
        order = (col.desc(), Run.id.desc()) if desc else (col.asc(), Run.id.asc())
        rows = list(db.scalars(q.order_by(*order).limit(limit + 1)))
    if nullable and len(rows) <= limit:  # then those without it, by id
        q = stmt.where(col.is_(None))
        if value is None:
            q = q.where(Run.id < last_id if desc else Run.id > last_id)
        rows += list(db.scalars(q.order_by(Run.id.desc() if desc else Run.id.asc())
                                .limit(limit + 1 - len(rows))))
    next_cursor = None
    if len(rows) > limit:
        rows = rows[:limit]
        next_cursor = _encode_cursor(getattr(rows[-1], key), rows[-1].id)
    return rows, next_cursor


_START = object()  # "no cursor": the first page


def request_cancel(db: Session, run: Run) -> Run:
    """Queued runs are cancelled at once (a worker that later receives the message finds them
    cancelled and skips them); running runs get the cooperative flag their worker polls."""
    if run.status == "queued":
        db.execute(update(Run).where(Run.id == run.id, Run.status == "queued").values(
            status="cancelled", finished_at=utcnow(), cancel_requested=True,
            error="cancelled before it started"))
    elif run.status == "running":
        db.execute(update(Run).where(Run.id == run.id).values(cancel_requested=True))
    db.commit()
    db.refresh(run)
    return run


def claim(db: Session, run_id: str, *, worker: str, task_id: str | None) -> tuple[bool, str]:
    """queued -> running, atomically: a redelivered message never launches a run twice."""
    now = utcnow()
    res = db.execute(update(Run).where(Run.id == run_id, Run.status == "queued",
                                       Run.cancel_requested.is_(False))
                     .values(status="running", started_at=now, heartbeat_at=now,
                             worker_host=worker, task_id=task_id))
    db.commit()
    if res.rowcount == 1:
        return True, "claimed"
    run = db.get(Run, run_id)
    if run is None:
        return False, "no such run"
    return False, f"run is {run.status}, not queued"


def heartbeat(db: Session, run_id: str) -> Run | None:
    db.execute(update(Run).where(Run.id == run_id, Run.status == "running")
               .values(heartbeat_at=utcnow()))
    db.commit()
    return db.get(Run, run_id)


def append_logs(db: Session, run_id: str, lines: list[dict],
                out: list | None = None) -> int:
    """Idempotent on (run_id, seq): a worker retrying a batch after a timeout adds nothing.
    `out` collects the added lines as (seq, rank, line) for the live streams."""
    if not lines:
        return 0
    seqs = [int(x["seq"]) for x in lines]
    have = set(db.scalars(select(RunLog.seq).where(RunLog.run_id == run_id,
                                                   RunLog.seq.in_(seqs))))
    added = 0
    for x in lines:
        if int(x["seq"]) in have:
            continue
        m = _RANK_PREFIX.match(x["line"])
        rank = int(m.group(1)) if m else None
        db.add(RunLog(run_id=run_id, seq=int(x["seq"]), rank=rank,
                      ts=datetime.fromisoformat(x["ts"]) if x.get("ts") else utcnow(),
                      line=x["line"]))
        if out is not None:
            out.append((int(x["seq"]), rank, x["line"]))
        have.add(int(x["seq"]))
        added += 1
    db.commit()
    return added


def logs_after(db: Session, run_id: str, after: int = -1, *, rank: int | None = None,
               limit: int = 1000) -> list[RunLog]:
    stmt = select(RunLog).where(RunLog.run_id == run_id, RunLog.seq > after)
    if rank is not None:
        stmt = stmt.where(or_(RunLog.rank == rank, RunLog.rank.is_(None)))
    return list(db.scalars(stmt.order_by(RunLog.seq).limit(limit)))


def finish(db: Session, run_id: str, *, status: str, exit_code: int | None, error: str | None,
           summary: dict | None, provenance: dict | None) -> Run | None:
    """running -> a final status. Idempotent: a retried report changes nothing, except that a
    report of the same outcome may add the summary a first, early report did not have yet."""
    assert status in FINISHED, status
    values = dict(status=status, exit_code=exit_code, error=error, summary=summary,
                  metrics=(summary or {}).get("headline"), provenance=provenance)
    res = db.execute(update(Run).where(Run.id == run_id, or_(Run.status == "running",
                                                             _reaped_as_lost()))
                     .values(**values, finished_at=utcnow()))
    if res.rowcount == 0 and summary is not None:
        db.execute(update(Run).where(Run.id == run_id, Run.status == status,
                                     Run.summary.is_(None))
                   .values(summary=summary, metrics=values["metrics"], provenance=provenance))
    db.commit()
    run = db.get(Run, run_id)
    if run is not None and run.status in FINISHED:  # the key figures as sortable columns
        db.execute(update(Run).where(Run.id == run_id).values(
            **metric_values(run.metrics, run.started_at, run.finished_at)))
        db.commit()
        db.refresh(run)
    return run


def record_file(db: Session, run_id: str, path: str, size: int, sha256: str) -> None:
    existing = db.get(RunFile, (run_id, path))
    if existing:
        existing.size, existing.sha256, existing.created_at = size, sha256, utcnow()
    else:
        db.add(RunFile(run_id=run_id, path=path, size=size, sha256=sha256, created_at=utcnow()))
    db.commit()


def list_files(db: Session, run_id: str) -> list[RunFile]:
    return list(db.scalars(select(RunFile).where(RunFile.run_id == run_id)
                           .order_by(RunFile.path)))


LOST_PREFIX = "worker lost: "


def _reaped_as_lost():
    """A run the reaper failed because its heartbeats stopped (not its worker's own report):
    a late finish report from that worker (it was partitioned, or the backend could not write
    its heartbeats: disk full) replaces the guess with the job's real outcome."""
    return and_(Run.status == "failed", Run.exit_code.is_(None),
                Run.error.like(LOST_PREFIX + "%"))


def reap_lost_runs(db: Session, *, timeout_s: float) -> list[str]:
    """Fail running runs whose worker stopped reporting (killed, host down, partitioned)."""
    cutoff = utcnow() - timedelta(seconds=timeout_s)
    lost = list(db.scalars(select(Run).where(Run.status == "running",
                                             Run.heartbeat_at < cutoff)))
    for run in lost:
        db.execute(update(Run).where(Run.id == run.id, Run.status == "running").values(
            status="failed", finished_at=utcnow(),
            error=f"{LOST_PREFIX}no heartbeat from {run.worker_host} for more than "
                  f"{timeout_s:g} s (worker killed, host down or unreachable); "
                  f"last heartbeat {run.heartbeat_at.isoformat()}"))
    db.commit()
    return [r.id for r in lost]


# -- the reconciler (backend/services/reconcile.py): queued runs no worker claimed -----------------

def unclaimed_runs(db: Session, *, older_than_s: float) -> list[Run]:
    """Queued runs whose message was last published more than `older_than_s` ago."""
    cutoff = utcnow() - timedelta(seconds=older_than_s)
    since = func.coalesce(Run.enqueued_at, Run.created_at)
    return list(db.scalars(select(Run).options(defer(Run.spec), defer(Run.summary))
                           .where(Run.status == "queued", Run.cancel_requested.is_(False),
                                  since < cutoff).order_by(since)))


def mark_enqueued(db: Session, run_id: str, *, attempts: int, count: bool = True) -> bool:
    """Take the run for one more publication (count=False: only restart its clock). The
    database is the lock between backend processes: only the one whose UPDATE still sees
    `attempts` goes on; the others see no row changed."""
    res = db.execute(update(Run).where(Run.id == run_id, Run.status == "queued",
                                       Run.enqueue_attempts == attempts)
                     .values(enqueue_attempts=attempts + (1 if count else 0),
                             enqueued_at=utcnow()))
    db.commit()
    return res.rowcount == 1


def fail_unclaimed(db: Session, run_id: str, *, attempts: int, error: str) -> bool:
    """queued -> failed after its last publication went unclaimed (same lock as above)."""
    res = db.execute(update(Run).where(Run.id == run_id, Run.status == "queued",
                                       Run.enqueue_attempts == attempts)
                     .values(status="failed", finished_at=utcnow(), error=error))
    db.commit()
    return res.rowcount == 1
