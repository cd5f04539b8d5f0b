"""users: a per-user slot-hours quota (max_slot_hours: world size x hours over the rolling
window Settings.quota_window_s; null falls back to Settings.default_max_slot_hours)

Revision ID: 0010
Revises: 0009
"""
import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("users") as b:
        b.add_column(sa.Column("max_slot_hours", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("users") as b:
        b.drop_column("max_slot_hours")
