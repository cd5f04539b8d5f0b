"""sweeps: a group of runs submitted as one (sweeps), and its members (sweep_members: the
overrides of each, the run it launched or the 422 errors that kept it from launching)

Revision ID: 0009
Revises: 0008
"""
import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sweeps",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("owner", sa.String(100), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("base", sa.JSON(), nullable=False),
        sa.Column("grid", sa.JSON(), nullable=True),
        sa.Column("tags", sa.JSON(), nullable=False),
        sa.Column("notes", sa.Text(), nullable=False, server_default=""),
    )
    op.create_index("ix_sweeps_owner", "sweeps", ["owner"])
    op.create_index("ix_sweeps_created_id", "sweeps", ["created_at", "id"])
    op.create_table(
        "sweep_members",
        sa.Column("sweep_id", sa.String(32), sa.ForeignKey("sweeps.id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("position", sa.Integer(), primary_key=True),
        sa.Column("overrides", sa.JSON(), nullable=False),
        sa.Column("run_id", sa.String(32), sa.ForeignKey("runs.id", ondelete="SET NULL"),
                  nullable=True),
        sa.Column("errors", sa.JSON(), nullable=True),
        sa.Column("predicted", sa.JSON(), nullable=True),
    )
    op.create_index("ix_sweep_members_run_id", "sweep_members", ["run_id"])


def downgrade() -> None:
    op.drop_index("ix_sweep_members_run_id", "sweep_members")
    op.drop_table("sweep_members")
    op.drop_index("ix_sweeps_created_id", "sweeps")
    op.drop_index("ix_sweeps_owner", "sweeps")
    op.drop_table("sweeps")
