"""the reconciler: runs count how often their message was published; refused worker credentials

Revision ID: 0006
Revises: 0005
"""
import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as b:
        b.add_column(sa.Column("enqueue_attempts", sa.Integer(), nullable=False,
                               server_default="1"))
        b.add_column(sa.Column("enqueued_at", sa.DateTime(timezone=True), nullable=True))
    op.create_table(
        "worker_rejections",
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("host", sa.String(200), nullable=False),
        sa.Column("remote", sa.String(100), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("first_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("worker_rejections")
    with op.batch_alter_table("runs") as b:
        b.drop_column("enqueued_at")
        b.drop_column("enqueue_attempts")
