"""The run history. Schema changes go through Alembic (backend/migrations), never create_all."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.types import TypeDecorator

# SQLite only auto-increments INTEGER PRIMARY KEY.
BigIntId = BigInteger().with_variant(Integer(), "sqlite")

# `hung`: stopped by the worker after runtime.hang_timeout_s without progress on any rank
# (docs/faults.md); the diagnosis says why.
STATUSES = ("queued", "running", "succeeded", "failed", "cancelled", "timed_out", "hung")
FINISHED = ("succeeded", "failed", "cancelled", "timed_out", "hung")
# The run's key figures kept as columns (sortable, filterable): the analysis headline's keys,
# plus the wall-clock duration from start to finish.
METRIC_COLUMNS = ("step_time_s", "tokens_per_s", "peak_memory_bytes", "exposed_comm_s",
                  "bubble_fraction", "overlap_pct", "final_loss", "duration_s")


def metric_values(headline: dict | None, started: datetime | None,
                  finished: datetime | None) -> dict:
    """The METRIC_COLUMNS values of a run: one place maps the headline onto the columns."""
    h = headline or {}
    out = {c: h.get(c) for c in METRIC_COLUMNS if c != "duration_s"}
    if out["peak_memory_bytes"] is not None:
        out["peak_memory_bytes"] = int(out["peak_memory_bytes"])
    out["duration_s"] = ((finished - started).total_seconds()
                         if started is not None and finished is not None else None)
    return out


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator):
    """Aware UTC datetimes on every database (SQLite stores them naive)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value, dialect):
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value, dialect):
        if value is not None and value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value


class Base(DeclarativeBase):
    pass


class Run(Base):
    __tablename__ = "runs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    owner: Mapped[str] = mapped_column(String(100), index=True)
    kind: Mapped[str] = mapped_column(String(32))
    strategy: Mapped[str] = mapped_column(String(64), index=True)
    spec: Mapped[dict] = mapped_column(JSON)
    spec_version: Mapped[int] = mapped_column(Integer)
    world_size: Mapped[int] = mapped_column(Integer)
    dp: Mapped[int] = mapped_column(Integer)
    tp: Mapped[int] = mapped_column(Integer)
    pp: Mapped[int] = mapped_column(Integer)
    # expert- and context-parallel degrees (migration 0011): the list shows every degree
    ep: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    cp: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    queue: Mapped[str] = mapped_column(String(64))
    # hosts the run spans (runtime.nnodes; > 1: gang-placed, its nodes in run_nodes)
    nnodes: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    status: Mapped[str] = mapped_column(String(16), index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    worker_host: Mapped[str | None] = mapped_column(String(200))
    task_id: Mapped[str | None] = mapped_column(String(200))
    exit_code: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    summary: Mapped[dict | None] = mapped_column(JSON(none_as_null=True))
    # Headline figures (step time, peak memory, bubble, overlap, ...) copied from the summary's
    # `headline` so the runs table never loads whole summaries.
    metrics: Mapped[dict | None] = mapped_column(JSON(none_as_null=True))
    # The key figures as columns, so the history sorts and filters by them with an index each
    # (migration 0005): set from the headline when the run reports its analysis.
    step_time_s: Mapped[float | None] = mapped_column(Float)
    tokens_per_s: Mapped[float | None] = mapped_column(Float)
    peak_memory_bytes: Mapped[int | None] = mapped_column(BigInteger)
    exposed_comm_s: Mapped[float | None] = mapped_column(Float)
    bubble_fraction: Mapped[float | None] = mapped_column(Float)
    overlap_pct: Mapped[float | None] = mapped_column(Float)
    final_loss: Mapped[float | None] = mapped_column(Float)
    duration_s: Mapped[float | None] = mapped_column(Float)
    notes: Mapped[str] = mapped_column(Text, default="")
    provenance: Mapped[dict | None] = mapped_column(JSON(none_as_null=True))
    # How often the run's message has been published, and when last (the reconciler publishes
    # again a queued run no worker claimed: migration 0006).
    enqueue_attempts: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    enqueued_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=utcnow)
    # The run this one continues from a checkpoint of (spec.resume.run_id; migration 0007):
    # the history links the two. SET NULL: deleting the parent keeps the child.
    parent_id: Mapped[str | None] = mapped_column(
        ForeignKey("runs.id", ondelete="SET NULL"), index=True)

    tags: Mapped[list[RunTag]] = relationship(
        cascade="all, delete-orphan", lazy="selectin", order_by="RunTag.tag")

    __table_args__ = (
        Index("ix_runs_created_id", "created_at", "id"),
        # The runs table filters by one of these and pages newest first (migration 0004).
        Index("ix_runs_status_created", "status", "created_at", "id"),
        Index("ix_runs_strategy_created", "strategy", "created_at", "id"),
        Index("ix_runs_owner_created", "owner", "created_at", "id"),
        *(Index(f"ix_runs_{c}", c, "id") for c in METRIC_COLUMNS),
    )


class RunTag(Base):
    __tablename__ = "run_tags"

    run_id: Mapped[str] = mapped_column(
        ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    tag: Mapped[str] = mapped_column(String(64), primary_key=True, index=True)


class RunLog(Base):
    __tablename__ = "run_logs"

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    seq: Mapped[int] = mapped_column(Integer)
    rank: Mapped[int | None] = mapped_column(Integer)
    ts: Mapped[datetime] = mapped_column(UTCDateTime())
    line: Mapped[str] = mapped_column(Text)
    # A multi-host run's lines: the node that wrote them and its own line number (the backend
    # gives them run-wide `seq`s in arrival order; migration 0008). NULL on one-host runs.
    node: Mapped[int | None] = mapped_column(Integer)
    nseq: Mapped[int | None] = mapped_column(Integer)

    __table_args__ = (UniqueConstraint("run_id", "seq", name="uq_run_logs_run_seq"),
                      UniqueConstraint("run_id", "node", "nseq",
                                       name="uq_run_logs_run_node_nseq"))


# A node of a gang-placed run: reserved (placed, its worker not started yet), running, or how it
# ended (a FINISHED status, or `lost`: its worker stopped reporting).
NODE_ACTIVE = ("reserved", "running")


class RunNode(Base):
    """One node of a multi-host run (runtime.nnodes > 1): the worker it is placed on, and that
    node's own supervision state (backend/services/placement.py, migration 0008)."""

    __tablename__ = "run_nodes"

    run_id: Mapped[str] = mapped_column(
        ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    node: Mapped[int] = mapped_column(Integer, primary_key=True)
    worker: Mapped[str] = mapped_column(String(200))
    host: Mapped[str] = mapped_column(String(200))
    ranks: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16))
    # node 0's rendezvous endpoint (address:port), published by its worker when it launches
    endpoint: Mapped[str | None] = mapped_column(String(300))
    task_id: Mapped[str | None] = mapped_column(String(200))
    reserved_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    exit_code: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    publish_attempts: Mapped[int] = mapped_column(Integer, default=1, server_default="1")

    __table_args__ = (Index("ix_run_nodes_worker_status", "worker", "status"),)


class RunFile(Base):
    __tablename__ = "run_files"

    run_id: Mapped[str] = mapped_column(
        ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    path: Mapped[str] = mapped_column(String(500), primary_key=True)
    size: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class Worker(Base):
    __tablename__ = "workers"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    host: Mapped[str] = mapped_column(String(200))
    queue: Mapped[str] = mapped_column(String(64))
    slots: Mapped[int] = mapped_column(Integer)
    busy: Mapped[int] = mapped_column(Integer)
    devices: Mapped[list] = mapped_column(JSON)
    info: Mapped[dict] = mapped_column(JSON)
    last_seen: Mapped[datetime] = mapped_column(UTCDateTime())


class WorkerRejection(Base):
    """A caller of /api/internal whose worker credential the backend refused, by the name it
    gave (X-Paralab-Worker), for health: a worker with a wrong PARALAB_WORKER_TOKEN consumes
    messages it can never claim."""

    __tablename__ = "worker_rejections"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    host: Mapped[str] = mapped_column(String(200))
    remote: Mapped[str] = mapped_column(String(100))
    count: Mapped[int] = mapped_column(Integer)
    first_at: Mapped[datetime] = mapped_column(UTCDateTime())
    last_at: Mapped[datetime] = mapped_column(UTCDateTime())


# -- accounts and the shared history (issue 8; migration 0003) -----------------------------------

class User(Base):
    __tablename__ = "users"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    username: Mapped[str] = mapped_column(String(64))
    # argon2id; "!" for the implicit local-mode user, who never logs in.
    password_hash: Mapped[str] = mapped_column(String(255))
    role: Mapped[str] = mapped_column(String(16))
    is_active: Mapped[bool] = mapped_column(Boolean, default=True)
    # Per-user limits; None falls back to the Settings defaults.
    max_concurrent_runs: Mapped[int | None] = mapped_column(Integer)
    max_world_size: Mapped[int | None] = mapped_column(Integer)
    # world size x hours over Settings.quota_window_s (backend/quotas.py; migration 0010)
    max_slot_hours: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    password_changed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())

    __table_args__ = (UniqueConstraint("username", name="uq_users_username"),)


class ApiToken(Base):
    """Personal API tokens (kind "api") and browser sessions (kind "session"): random, shown
    once, stored as SHA-256 only."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    kind: Mapped[str] = mapped_column(String(16))
    name: Mapped[str] = mapped_column(String(100))
    prefix: Mapped[str] = mapped_column(String(16))
    token_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime())

    __table_args__ = (UniqueConstraint("token_hash", name="uq_api_tokens_token_hash"),)


class AuditEntry(Base):
    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True, autoincrement=True)
    ts: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, index=True)
    actor: Mapped[str] = mapped_column(String(100), index=True)
    action: Mapped[str] = mapped_column(String(64), index=True)
    target: Mapped[str | None] = mapped_column(String(200))
    detail: Mapped[dict | None] = mapped_column(JSON)
    client: Mapped[str | None] = mapped_column(String(100))


class Star(Base):
    __tablename__ = "stars"

    user_id: Mapped[int] = mapped_column(
        ForeignKey("users.id", ondelete="CASCADE"), primary_key=True)
    run_id: Mapped[str] = mapped_column(
        ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True, index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class SavedComparison(Base):
    __tablename__ = "saved_comparisons"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    owner: Mapped[str] = mapped_column(String(100), index=True)
    run_ids: Mapped[list] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class Sweep(Base):
    """A group of runs submitted as one (backend/services/sweeps.py, docs/sweeps.md). Its
    status is derived from its members' runs (backend/crud/sweeps.py sweep_status), never
    stored, so it cannot drift from them."""

    __tablename__ = "sweeps"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    owner: Mapped[str] = mapped_column(String(100), index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    # the submitted body's base, grid (null for an explicit member list), tags and notes
    base: Mapped[dict] = mapped_column(JSON)
    grid: Mapped[dict | None] = mapped_column(JSON(none_as_null=True))
    tags: Mapped[list] = mapped_column(JSON)
    notes: Mapped[str] = mapped_column(Text, default="")

    members: Mapped[list[SweepMember]] = relationship(
        cascade="all, delete-orphan", lazy="selectin", order_by="SweepMember.position")

    __table_args__ = (Index("ix_sweeps_created_id", "created_at", "id"),)


class SweepMember(Base):
    """One member: its overrides over the base, and either the run it launched or the 422
    errors that kept it from launching (kept, so the sweep page shows why)."""

    __tablename__ = "sweep_members"

    sweep_id: Mapped[str] = mapped_column(
        ForeignKey("sweeps.id", ondelete="CASCADE"), primary_key=True)
    position: Mapped[int] = mapped_column(Integer, primary_key=True)
    overrides: Mapped[dict] = mapped_column(JSON)
    # SET NULL: deleting a member's run from the history keeps the member (status "deleted")
    run_id: Mapped[str | None] = mapped_column(
        ForeignKey("runs.id", ondelete="SET NULL"), index=True)
    errors: Mapped[list | None] = mapped_column(JSON(none_as_null=True))
    # jobs.theory.predict's figures for the member's spec, taken once at submit (the spec
    # cannot change): the sweep page sets them against the run's measured ones
    predicted: Mapped[dict | None] = mapped_column(JSON(none_as_null=True))

    run: Mapped[Run | None] = relationship(lazy="selectin")


class Upload(Base):
    """An uploaded archive of a user's working directory, stored once per content at
    DATA_DIR/uploads/<sha256>.<kind> (backend/services/uploads.py; migration 0012). `name` is
    the file name as uploaded, only ever shown; `entries` the member paths (the first
    ENTRIES_KEPT)."""

    __tablename__ = "uploads"

    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    size: Mapped[int] = mapped_column(BigInteger)
    owner: Mapped[str] = mapped_column(String(100), index=True)
    name: Mapped[str] = mapped_column(String(200))
    kind: Mapped[str] = mapped_column(String(8))
    file_count: Mapped[int] = mapped_column(Integer)
    unpacked_bytes: Mapped[int] = mapped_column(BigInteger)
    entries: Mapped[list] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
