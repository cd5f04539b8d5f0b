"""runs resumed from a checkpoint of an earlier run name it (parent_id); status `hung`

Revision ID: 0007
Revises: 0006
"""
import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as b:
        b.add_column(sa.Column("parent_id", sa.String(32), nullable=True))
        b.create_foreign_key("fk_runs_parent_id", "runs", ["parent_id"], ["id"],
                             ondelete="SET NULL")
        b.create_index("ix_runs_parent_id", ["parent_id"])


def downgrade() -> None:
    with op.batch_alter_table("runs") as b:
        b.drop_index("ix_runs_parent_id")
        b.drop_constraint("fk_runs_parent_id", type_="foreignkey")
        b.drop_column("parent_id")
