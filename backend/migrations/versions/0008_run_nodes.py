"""multi-host runs: runs.nnodes; one row per node of a gang-placed run (run_nodes); log lines
tagged with the node that wrote them (run_logs.node, run_logs.nseq: the node's line number)

Revision ID: 0008
Revises: 0007
"""
import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "run_nodes",
        sa.Column("run_id", sa.String(32), sa.ForeignKey("runs.id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("node", sa.Integer(), primary_key=True),
        sa.Column("worker", sa.String(200), nullable=False),
        sa.Column("host", sa.String(200), nullable=False),
        sa.Column("ranks", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("endpoint", sa.String(300), nullable=True),
        sa.Column("task_id", sa.String(200), nullable=True),
        sa.Column("reserved_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("publish_attempts", sa.Integer(), nullable=False, server_default="1"),
    )
    op.create_index("ix_run_nodes_worker_status", "run_nodes", ["worker", "status"])
    with op.batch_alter_table("runs") as b:
        b.add_column(sa.Column("nnodes", sa.Integer(), nullable=False, server_default="1"))
    with op.batch_alter_table("run_logs") as b:
        b.add_column(sa.Column("node", sa.Integer(), nullable=True))
        b.add_column(sa.Column("nseq", sa.Integer(), nullable=True))
        b.create_unique_constraint("uq_run_logs_run_node_nseq", ["run_id", "node", "nseq"])


def downgrade() -> None:
    with op.batch_alter_table("run_logs") as b:
        b.drop_constraint("uq_run_logs_run_node_nseq", type_="unique")
        b.drop_column("nseq")
        b.drop_column("node")
    with op.batch_alter_table("runs") as b:
        b.drop_column("nnodes")
    op.drop_index("ix_run_nodes_worker_status", "run_nodes")
    op.drop_table("run_nodes")
