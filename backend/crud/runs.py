"""Runs: create, list (filter, sort, cursor), cancel, claim, heartbeat, logs, files, finish,
reap. Routes and services call one function here and return."""

from __future__ import annotations

import base64
import json
import math
import re
import secrets
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import and_, case, delete, func, null, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, defer

from backend.crud.log_lines import line_time, rank_of
from backend.crud.nodes import HOST_LOST_PREFIX, cancel_reserved  # runs -> nodes, not back
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
from jobs.spec import JobSpec, text_problem

SORT_KEYS = {"created_at": Run.created_at, "name": Run.name, "status": Run.status,
             "strategy": Run.strategy, "world_size": Run.world_size,
             **{c: getattr(Run, c) for c in METRIC_COLUMNS}}


def new_run_id() -> str:
    return secrets.token_hex(6)


def create_run(db: Session, spec: JobSpec, *, owner: str, tags: list[str], notes: str,
               commit: bool = True) -> Run:
    """A queued run. commit=False: the caller commits it with others (a sweep's members, all
    in one transaction)."""
    run = Run(id=new_run_id(), name=spec.name, owner=owner, kind=spec.kind,
              strategy=spec.strategy, spec=spec.to_dict(), spec_version=spec.version,
              world_size=spec.world_size, dp=spec.parallel.dp, tp=spec.parallel.tp,
              pp=spec.parallel.pp, ep=spec.parallel.ep, cp=spec.parallel.cp,
              queue=spec.runtime.queue, nnodes=spec.runtime.nnodes,
              status="queued",
              created_at=utcnow(), cancel_requested=False, notes=notes,
              tags=[RunTag(tag=t) for t in dict.fromkeys(tags)],
              parent_id=spec.resume.run_id or None)
    db.add(run)
    if commit:
        db.commit()
    return run


def create_imported(db: Session, spec: JobSpec, run_id: str, *, owner: str, tags: list[str],
                    notes: str, summary: dict, files: list[tuple[str, int, str]]) -> Run:
    """An import run (traces made elsewhere, already analysed): stored finished in one
    transaction with its files (path, size, sha256), so it is whole or absent. It never ran
    here: no start time, no duration."""
    now = utcnow()
    headline = summary.get("headline")
    run = Run(id=run_id, name=spec.name, owner=owner, kind=spec.kind, strategy=spec.strategy,
              spec=spec.to_dict(), spec_version=spec.version, world_size=spec.world_size,
              dp=spec.parallel.dp, tp=1, pp=1, ep=1, cp=1, queue=spec.runtime.queue, nnodes=1,
              status="succeeded", created_at=now, started_at=None, finished_at=now,
              cancel_requested=False, notes=notes, exit_code=0, summary=summary,
              metrics=headline, tags=[RunTag(tag=t) for t in dict.fromkeys(tags)],
              **metric_values(headline, None, None))
    db.add(run)
    db.add_all(RunFile(run_id=run_id, path=p, size=n, sha256=h, created_at=now)
               for p, n, h in files)
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


_NOT_A_CURSOR = "cursor: not a cursor returned by this API"
_INT64 = 2**63 - 1


def _cursor_value(value, key: str):
    """The sort key's value as the column compares it; ValueError for any other shape."""
    if key == "created_at":
        if not (isinstance(value, dict) and set(value) == {"dt"} and isinstance(value["dt"],
                                                                                str)):
            raise ValueError(f"{_NOT_A_CURSOR} (for sort {key!r})")
        return datetime.fromisoformat(value["dt"])  # ValueError when it is not a date
    col_type = SORT_KEYS[key].type.python_type
    if value is None and key in METRIC_COLUMNS:  # the runs without the figure
        return None
    if col_type is str and isinstance(value, str) and text_problem(value) is None:
        return value
    if col_type is float and type(value) in (int, float):
        # an integer goes to the driver as an integer: one past int64 overflows the bind
        # (SQLite) or the comparison (PostgreSQL), so it is compared as the float it stands for
        value = float(value)  # OverflowError past 1e308: not a cursor either
        if math.isfinite(value):
            return value
    if col_type is int and type(value) is int and abs(value) <= _INT64:
        return value
    raise ValueError(f"{_NOT_A_CURSOR} (for sort {key!r})")


def decode_cursor(cursor: str, key: str = "created_at") -> tuple:
    """[value, run_id] of the last row of a page sorted by `key`. Raises ValueError on a
    cursor this server did not produce (any shape, type or value that the query could not
    compare with the column)."""
    try:
        value, run_id = json.loads(base64.urlsafe_b64decode(cursor.encode()))
        if not isinstance(run_id, str) or len(run_id) > 32 or text_problem(run_id):
            raise ValueError("bad run id")
        return _cursor_value(value, key), run_id
    except Exception as exc:  # noqa: BLE001 - any malformed cursor is the same user error
        raise ValueError(_NOT_A_CURSOR) from exc


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
    value, last_id = decode_cursor(cursor, key) if cursor else (_START, None)
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
        res = db.execute(update(Run).where(Run.id == run.id, Run.status == "queued").values(
            status="cancelled", finished_at=utcnow(), cancel_requested=True,
            error="cancelled before it started"))
        if res.rowcount == 0:  # a worker claimed it meanwhile: the running run's flag
            db.execute(update(Run).where(Run.id == run.id, Run.status == "running").values(
                cancel_requested=True))
        elif run.nnodes > 1:  # its reserved hosts are free again at once
            cancel_reserved(db, run.id)
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
                out: list | None = None, problems: list | None = None) -> int:
    """Idempotent on (run_id, seq): a worker retrying a batch after a timeout adds nothing,
    even while the first attempt is still being stored (one INSERT ... ON CONFLICT DO NOTHING:
    the database decides which lines are new, atomically, on both dialects). `out` collects
    the added lines as (seq, rank, line) for the live streams; `problems`, (index in `lines`,
    field, why) of each added line stored other than it came (line_time)."""
    rows, why, now = {}, {}, utcnow()
    for i, x in enumerate(lines):  # a seq twice in one batch: the first one counts
        if int(x["seq"]) in rows:
            continue
        ts, problem = line_time(x.get("ts"), now)
        if problem:
            why[int(x["seq"])] = (i, "ts", problem)
        rows[int(x["seq"])] = {"run_id": run_id, "seq": int(x["seq"]),
                               "rank": rank_of(x["line"]), "ts": ts, "line": x["line"]}
    if not rows:
        return 0
    dialect = {"postgresql": postgresql, "sqlite": sqlite}[db.get_bind().dialect.name]
    # On the table, not the ORM entity: a Core executemany, without the ORM's bulk-insert
    # bookkeeping, which fetched and matched every row's primary key (the log ingest was
    # about a third of the API's samples over a 2,000-step run; bench/log_ingest.py)
    table = RunLog.__table__
    stmt = (dialect.insert(table).on_conflict_do_nothing(index_elements=["run_id", "seq"])
            .returning(table.c.seq))
    # In seq order: concurrent overlapping batches take the rows' locks (PostgreSQL) in one
    # order, so they wait for each other and never deadlock.
    added = set(db.execute(stmt, [rows[s] for s in sorted(rows)]).scalars())
    db.commit()
    if out is not None:
        out += [(s, rows[s]["rank"], rows[s]["line"]) for s in sorted(added)]
    if problems is not None:
        problems += sorted(why[s] for s in added if s in why)
    return len(added)


def _rank_match(rank: int):
    """A rank filter keeps that rank's lines and the lines of no rank (the worker's own)."""
    return or_(RunLog.rank == rank, RunLog.rank.is_(None))


def logs_after(db: Session, run_id: str, after: int = -1, *, rank: int | None = None,
               limit: int = 1000) -> list[RunLog]:
    stmt = select(RunLog).where(RunLog.run_id == run_id, RunLog.seq > after)
    if rank is not None:
        stmt = stmt.where(_rank_match(rank))
    return list(db.scalars(stmt.order_by(RunLog.seq).limit(limit)))


def log_page(db: Session, run_id: str, after: int = -1, *, rank: int | None = None,
             limit: int = 1000) -> list[tuple[int, int | None, str | None]]:
    """The next `limit` lines after seq `after`, in order, as (seq, rank, line) columns (no
    ORM objects: streams replay thousands). With `rank`, a line of another rank comes back as
    (seq, rank, None): a filtered page scans the same rows an unfiltered one does, and its
    reader's cursor moves to the last row's seq whether any matched (never reading them
    again), so a filter costs no more than no filter.

    Read as the range (after, after + limit] first: a run's seqs are contiguous (the worker
    numbers its lines, the backend a multi-host run's) but for a batch never delivered, so
    that range is nearly always the whole page, a bounded read whatever plan the database
    picks (PostgreSQL's, for a run newer than its statistics, reads and sorts every line after
    `after` for an open-ended ORDER BY ... LIMIT: quadratic over a replay). What it misses (a
    gap, or the end of the log) comes from after the range."""
    line = RunLog.line if rank is None else case((_rank_match(rank), RunLog.line), else_=null())
    cols = select(RunLog.seq, RunLog.rank, line).where(RunLog.run_id == run_id)
    rows = db.execute(cols.where(RunLog.seq > after, RunLog.seq <= after + limit)
                      .order_by(RunLog.seq)).all()
    if len(rows) < limit:
        rows += db.execute(cols.where(RunLog.seq > after + limit).order_by(RunLog.seq)
                           .limit(limit - len(rows))).all()
    return [tuple(r) for r in rows]


# A rank's end-of-step line (jobs/loop.py prints "step N loss ... time ..." after each step)
_STEP_LINE = re.compile(r"^\[(?:default|rank)\d+\]:step (\d+) ")
PROGRESS_SCAN = 500  # newest lines read for the last step line (one bounded, indexed read)


def last_progress(db: Session, run_id: str) -> dict | None:
    """The run's last sign of progress, from its log as stored: the newest end-of-step line of
    any rank ({kind: "step", step, rank, at}), else the newest line a rank wrote (kind "log":
    it started, no step yet), else None. The run page shows its age (is it stalled?) beside
    runtime.hang_timeout_s. Reads only the newest PROGRESS_SCAN lines: a traceback longer
    than that after the last step falls back to "log"."""
    rows = db.execute(select(RunLog.rank, RunLog.ts, RunLog.line)
                      .where(RunLog.run_id == run_id, RunLog.rank.is_not(None))
                      .order_by(RunLog.seq.desc()).limit(PROGRESS_SCAN)).all()
    for rank, ts, line in rows:
        m = _STEP_LINE.match(line)
        if m and len(m.group(1)) < 10:
            return {"kind": "step", "step": int(m.group(1)), "rank": rank, "at": ts}
    if rows:
        return {"kind": "log", "step": None, "rank": rows[0][0], "at": rows[0][1]}
    return None


def run_status(db: Session, run_id: str) -> str | None:
    """The run's status alone (a stream's page reads it beside the lines), None: no run."""
    return db.scalar(select(Run.status).where(Run.id == run_id))


def finish(db: Session, run_id: str, *, status: str, exit_code: int | None, error: str | None,
           summary: dict | None, provenance: dict | None) -> Run | None:
    """running -> a final status. Idempotent: a retried report changes nothing, except that a
    report of the same outcome may add the summary a first, early report did not have yet."""
    assert status in FINISHED, status
    metrics = (summary or {}).get("headline")
    started = db.scalar(select(Run.started_at).where(Run.id == run_id))
    now = utcnow()
    # the key figures as sortable columns in the same statement as the status: a reader
    # between two commits saw a succeeded run without its figures (a sweep's member, once)
    values = dict(status=status, exit_code=exit_code, error=error, summary=summary,
                  metrics=metrics, provenance=provenance, finished_at=now,
                  **metric_values(metrics, started, now))
    res = db.execute(update(Run).where(Run.id == run_id, or_(Run.status == "running",
                                                             _reaped_as_lost()))
                     .values(**values))
    if res.rowcount == 0 and summary is not None:
        # the same outcome reported again with the summary; or a multi-host run failed as
        # "host lost" whose surviving coordinator still analysed what the nodes traced
        finished = db.scalar(select(Run.finished_at).where(Run.id == run_id))
        db.execute(update(Run).where(Run.id == run_id, or_(
            Run.status == status, and_(Run.status == "failed",
                                       Run.error.like(HOST_LOST_PREFIX + "%"))),
                                     Run.summary.is_(None))
                   .values(summary=summary, metrics=metrics, provenance=provenance,
                           **metric_values(metrics, started, finished)))
    db.commit()
    run = db.get(Run, run_id)
    if run is not None:
        db.refresh(run)  # the session keeps objects past a commit (expire_on_commit=False)
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
    # (multi-host runs are the placer's: backend/services/placement.py reconcile_nodes)
    return list(db.scalars(select(Run).options(defer(Run.spec), defer(Run.summary))
                           .where(Run.status == "queued", Run.cancel_requested.is_(False),
                                  Run.nnodes == 1, since < cutoff).order_by(since)))


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
