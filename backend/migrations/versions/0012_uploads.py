"""uploads: archives of a user's working directory, one row per content (sha256), with the
uploader, the shown name, the kind (tar.gz | zip), the member count, the unpacked size and the
member paths

Revision ID: 0012
Revises: 0011
"""
import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "uploads",
        sa.Column("sha256", sa.String(64), primary_key=True),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("owner", sa.String(100), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column("file_count", sa.Integer(), nullable=False),
        sa.Column("unpacked_bytes", sa.BigInteger(), nullable=False),
        sa.Column("entries", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_uploads_owner", "uploads", ["owner"])


def downgrade() -> None:
    op.drop_index("ix_uploads_owner", "uploads")
    op.drop_table("uploads")
