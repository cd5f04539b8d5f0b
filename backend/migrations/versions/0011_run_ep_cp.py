"""runs: the expert- and context-parallel degrees as columns (ep, cp), as dp / tp / pp are, so
the runs list shows every degree without loading each run's spec (issue 37, item 10); existing
rows take theirs from the stored spec

Revision ID: 0011
Revises: 0010
"""
import json

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def _degree(parallel: dict, key: str) -> int:
    v = parallel.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) and 1 <= v < 2**31 else 1


def upgrade() -> None:
    with op.batch_alter_table("runs") as b:
        b.add_column(sa.Column("ep", sa.Integer(), nullable=False, server_default="1"))
        b.add_column(sa.Column("cp", sa.Integer(), nullable=False, server_default="1"))
    conn = op.get_bind()
    runs = sa.table("runs", sa.column("id", sa.String), sa.column("spec", sa.JSON),
                    sa.column("ep", sa.Integer), sa.column("cp", sa.Integer))
    # only the runs whose spec says more than 1 (the server default is right for the rest)
    for rid, spec in conn.execute(sa.select(runs.c.id, runs.c.spec)).all():
        if isinstance(spec, str):
            try:
                spec = json.loads(spec)
            except ValueError:
                continue
        par = (spec or {}).get("parallel") if isinstance(spec, dict) else None
        if not isinstance(par, dict):
            continue
        ep, cp = _degree(par, "ep"), _degree(par, "cp")
        if ep > 1 or cp > 1:
            conn.execute(runs.update().where(runs.c.id == rid).values(ep=ep, cp=cp))


def downgrade() -> None:
    with op.batch_alter_table("runs") as b:
        b.drop_column("cp")
        b.drop_column("ep")
