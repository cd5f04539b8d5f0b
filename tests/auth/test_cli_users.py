"""`paralab users`: the CLI calls the same crud as the API and prints the same messages (domain
errors and "field: rule" errors) with exit code 2."""

from __future__ import annotations

import io

import pytest

from backend import cli, crud
from backend.core.config import get_settings
from backend.core.db import get_sessionmaker
from tests.auth.conftest import PASSWORD


@pytest.fixture
def cli_env(monkeypatch, tmp_path, db_url):
    monkeypatch.setenv("PARALAB_DATA_DIR", str(tmp_path / "var"))
    monkeypatch.setenv("DATABASE_URL", db_url)
    for k in ("PARALAB_ARGON2_TIME_COST", "PARALAB_ARGON2_MEMORY_KIB"):
        monkeypatch.setenv(k, "1" if "TIME" in k else "1024")
    monkeypatch.setenv("PARALAB_ARGON2_PARALLELISM", "1")
    get_settings.cache_clear()
    yield db_url
    get_settings.cache_clear()


def _run(monkeypatch, capsys, *argv, stdin=""):
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_users_create_list_set_and_errors(cli_env, monkeypatch, capsys):
    code, out, _ = _run(monkeypatch, capsys, "users", "create", "alice", "--role", "viewer",
                        "--password-stdin", stdin=PASSWORD + "\n")
    assert (code, out) == (0, "created alice (viewer)\n")
    code, out, _ = _run(monkeypatch, capsys, "users", "list")
    assert code == 0 and out.split()[:3] == ["alice", "viewer", "active"]
    code, _, err = _run(monkeypatch, capsys, "users", "set", "nobody", "--role", "admin")
    assert (code, err) == (2, "paralab: no user 'nobody'\n")  # NotFound, as the API says it
    code, _, err = _run(monkeypatch, capsys, "users", "create", "Bad Name", "--password-stdin",
                        stdin=PASSWORD + "\n")
    assert code == 2 and err.startswith("paralab: username: 1-64 characters")
    code, _, err = _run(monkeypatch, capsys, "users", "create", "bob", "--password-stdin",
                        stdin="abc\n")
    assert code == 2 and err.startswith("paralab: password: at least")
    code, out, _ = _run(monkeypatch, capsys, "users", "set", "alice", "--role", "member")
    assert (code, out) == (0, "updated alice (member, active)\n")
    with get_sessionmaker(cli_env)() as db:
        assert crud.get_user(db, "alice").role == "member"
        assert [e.action for e in crud.list_audit(db)] == ["user.role_change", "user.create"]
