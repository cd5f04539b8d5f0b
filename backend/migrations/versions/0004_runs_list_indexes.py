"""indexes for the filtered runs list: (filter column, created_at, id)

Revision ID: 0004
Revises: 0003
"""
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_INDEXES = {"ix_runs_status_created": "status", "ix_runs_strategy_created": "strategy",
            "ix_runs_owner_created": "owner"}


def upgrade() -> None:
    for name, col in _INDEXES.items():
        op.create_index(name, "runs", [col, "created_at", "id"])


def downgrade() -> None:
    for name in _INDEXES:
        op.drop_index(name, table_name="runs")
