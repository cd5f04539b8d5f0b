"""Team-mode fixtures: an app with PARALAB_AUTH=required on each database, users of each role
and their API tokens. argon2 runs with a small cost here (the defaults are for production)."""

from __future__ import annotations

import secrets

import pytest
from fastapi.testclient import TestClient

from backend import crud
from backend.core.config import Settings
from backend.core.db import get_sessionmaker
from backend.main import create_app

SECRET = secrets.token_hex(32)
PASSWORD = "correct horse battery"
FAST_ARGON2 = {"argon2_time_cost": 1, "argon2_memory_kib": 1024, "argon2_parallelism": 1}


@pytest.fixture
def team_settings(tmp_path, db_url) -> Settings:
    return Settings(data_dir=tmp_path / "var", database_url=db_url, worker_token="w" * 40,
                    auth="required", secret_key=SECRET, **FAST_ARGON2)


@pytest.fixture
def team_app(team_settings):
    return create_app(team_settings)


@pytest.fixture
def team(team_app):
    with TestClient(team_app) as c:
        yield c


class Users:
    """Creates users straight in the database and hands out bearer headers."""

    def __init__(self, settings: Settings):
        self.settings = settings

    def create(self, name: str, role: str = "member", **limits) -> dict:
        with get_sessionmaker(self.settings.db_url)() as db:
            user = crud.create_user(db, self.settings, name, PASSWORD, role=role, **limits)
            raw, _ = crud.create_credential(db, user, kind="api", name="test", ttl_s=None)
        return {"Authorization": f"Bearer {raw}"}


@pytest.fixture
def users(team_settings) -> Users:
    return Users(team_settings)
