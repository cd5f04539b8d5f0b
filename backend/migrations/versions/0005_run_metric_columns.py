"""the runs' key figures as indexed columns (sort and filter the history by them)

Revision ID: 0005
Revises: 0004
"""
import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

# Spelled out here (a migration is a snapshot; backend.models may change later).
_FLOATS = ("step_time_s", "tokens_per_s", "exposed_comm_s", "bubble_fraction", "overlap_pct",
           "final_loss", "duration_s")
_COLUMNS = (*_FLOATS, "peak_memory_bytes")


def upgrade() -> None:
    with op.batch_alter_table("runs") as b:
        for c in _FLOATS:
            b.add_column(sa.Column(c, sa.Float(), nullable=True))
        b.add_column(sa.Column("peak_memory_bytes", sa.BigInteger(), nullable=True))
    for c in _COLUMNS:
        op.create_index(f"ix_runs_{c}", "runs", [c, "id"])
    # backfill from the headline JSON the runs already hold
    runs = sa.table("runs", sa.column("id", sa.String), sa.column("metrics", sa.JSON),
                    sa.column("started_at", sa.DateTime), sa.column("finished_at", sa.DateTime),
                    *(sa.column(c) for c in _COLUMNS))
    conn = op.get_bind()
    rows = conn.execute(sa.select(runs.c.id, runs.c.metrics, runs.c.started_at,
                                  runs.c.finished_at)).all()
    for rid, metrics, started, finished in rows:
        h = metrics if isinstance(metrics, dict) else {}
        vals = {c: h.get(c) for c in _FLOATS if c != "duration_s"}
        peak = h.get("peak_memory_bytes")
        vals["peak_memory_bytes"] = int(peak) if peak is not None else None
        vals["duration_s"] = _seconds(started, finished)
        if any(v is not None for v in vals.values()):
            conn.execute(runs.update().where(runs.c.id == rid).values(**vals))


def _seconds(started, finished):
    if started is None or finished is None:
        return None
    if isinstance(started, str):  # SQLite hands back text
        from datetime import datetime
        started, finished = datetime.fromisoformat(started), datetime.fromisoformat(finished)
    return (finished - started).total_seconds()


def downgrade() -> None:
    for c in _COLUMNS:
        op.drop_index(f"ix_runs_{c}", table_name="runs")
    with op.batch_alter_table("runs") as b:
        for c in _COLUMNS:
            b.drop_column(c)
