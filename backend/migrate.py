"""Apply Alembic migrations programmatically (`paralab migrate`, `paralab up`, tests)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from alembic import command
from alembic.config import Config

MIGRATIONS = Path(__file__).resolve().parent / "migrations"


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["url"] = url
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    command.upgrade(alembic_config(url), revision)


def schema_behind(url: str) -> str | None:
    """Why the database at `url` cannot serve this code's tables (never migrated, or at an
    older revision), in words with the command that fixes it; None when it is at the head."""
    from alembic.runtime.migration import MigrationContext

    from backend.core.db import get_engine

    heads = _heads()
    with get_engine(url).connect() as conn:
        current = set(MigrationContext.configure(conn).get_current_heads())
    if current == heads:
        return None
    at = ", ".join(sorted(current)) or "none: never migrated"
    return (f"the database schema is not migrated (revision {at}; this version needs "
            f"{', '.join(sorted(heads))}): run `paralab migrate` (or `paralab up`, which "
            "migrates first)")


@lru_cache(maxsize=1)
def _heads() -> frozenset[str]:
    """This code's migration heads (its files do not change while it runs)."""
    from alembic.script import ScriptDirectory
    return frozenset(ScriptDirectory.from_config(alembic_config("unused")).get_heads())
