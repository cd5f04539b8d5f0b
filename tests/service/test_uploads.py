"""POST /api/uploads, GET /api/uploads/{sha256} and the worker's GET /api/internal/uploads/{sha256},
in-process on SQLite and PostgreSQL: each unsafe archive is a 422 naming `file` and the member,
with nothing stored (no row, no file, no audit entry); the same bytes are one record; the quota
counts what a user owns; viewers may not upload; workers get the bytes with their credential
only."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import zipfile

import pytest
from fastapi.testclient import TestClient

from backend.core.config import Settings
from backend.core.db import get_sessionmaker
from backend.main import create_app
from backend.models import AuditEntry, Upload
from tests.auth.conftest import FAST_ARGON2, SECRET, Users

LIMITS = {"upload_max_mb": 1, "upload_max_unpacked_mb": 2, "upload_max_files": 20,
          "upload_quota_mb": 1}
WORKER = "t" * 32


@pytest.fixture
def settings(tmp_path, db_url):
    return Settings(data_dir=tmp_path / "var", database_url=db_url, worker_token=WORKER,
                    **LIMITS)


def tgz(members: list[tuple[str, bytes | None, bytes, str]]) -> bytes:
    """(name, data, type, linkname) -> the .tar.gz's bytes."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for name, data, type_, link in members:
            info = tarfile.TarInfo(name)
            info.type, info.linkname = type_, link
            info.size = len(data or b"")
            t.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def f(name: str, data: bytes = b"x") -> tuple:
    return (name, data, tarfile.REGTYPE, "")


def link(name: str, target: str, type_=tarfile.SYMTYPE) -> tuple:
    return (name, None, type_, target)


def post(client, data: bytes, name: str = "work.tar.gz", headers=None):
    return client.post("/api/uploads", files={"file": (name, data)}, headers=headers or {})


def stored(settings) -> tuple[list, list, list]:
    """(upload rows, files under DATA_DIR/uploads, upload.create audit entries)."""
    with get_sessionmaker(settings.db_url)() as db:
        rows = db.query(Upload).all()
        audit = db.query(AuditEntry).filter(AuditEntry.action == "upload.create").all()
    d = settings.uploads_dir
    return rows, sorted(p.name for p in d.iterdir()) if d.exists() else [], audit


def zip_bytes(name: str, data: bytes) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr(name, data, compress_type=zipfile.ZIP_DEFLATED)
    return buf.getvalue()


REFUSED = [
    ("zip-slip", tgz([f("ok.py"), f("../x")]), "../x", "'..'"),
    ("absolute", tgz([f("/etc/cron.d/x")]), "/etc/cron.d/x", "absolute"),
    ("symlink out", tgz([link("data", "../../etc")]), "data", "leaves the directory"),
    ("hardlink out", tgz([link("h", "../../etc/passwd", tarfile.LNKTYPE)]), "h", "outside"),
    ("device", tgz([("null", None, tarfile.CHRTYPE, "")]), "null", "device"),
    ("too many", tgz([f(f"f{i:02d}") for i in range(21)]), "f20", "more than 20 members"),
    ("bomb", zip_bytes("zeros.bin", bytes(3 << 20)), "zeros.bin", "unpacks to more than"),
]


@pytest.mark.parametrize("case, data, member, rule", REFUSED, ids=[c[0] for c in REFUSED])
def test_unsafe_archives_are_422_naming_the_member(client, settings, case, data, member, rule):
    r = post(client, data)
    assert r.status_code == 422, r.text
    [err] = r.json()["detail"]
    assert err["loc"] == ["body", "file"]
    assert f"work.tar.gz: {member}:" in err["msg"] and rule in err["msg"], err["msg"]
    assert stored(settings) == ([], [], [])


def test_zip_bomb_is_small(client, settings):
    assert len(REFUSED[-1][1]) < 16 << 10  # 3 MiB of zeros, a few KiB uploaded


def test_not_an_archive_and_too_large(client, settings):
    r = post(client, b"#!/bin/sh\nrm -rf /\n", "work.zip")
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "file"]
    assert "not a .tar.gz" in r.json()["detail"][0]["msg"]
    r = post(client, os.urandom((1 << 20) + 1), "big.tar.gz")
    assert r.status_code == 422
    assert "big.tar.gz: over the upload limit" in r.json()["detail"][0]["msg"]
    # no Content-Length (chunked): refused by the bytes counted as they arrive
    body = (b"--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"s.tgz\"\r\n\r\n"
            + b"\x1f\x8b" + bytes(3 << 20) + b"\r\n--B--\r\n")
    r = client.post("/api/uploads", content=(body[i:i + 65536] for i in range(0, len(body), 65536)),
                    headers={"Content-Type": "multipart/form-data; boundary=B"})
    assert r.status_code == 422 and "s.tgz: over the upload limit" in r.json()["detail"][0]["msg"]
    r = client.post("/api/uploads", files={"other": ("a.tgz", b"x")})
    assert r.status_code == 422 and "no `file` part" in r.json()["detail"][0]["msg"]
    r = client.post("/api/uploads", content=tgz([f("a")]))  # not multipart
    assert r.status_code == 422 and "multipart/form-data" in r.json()["detail"][0]["msg"]
    assert stored(settings) == ([], [], [])


def test_upload_dedup_get_and_worker_download(client, settings):
    data = tgz([f("train.py", b"print(1)\n"), ("pkg", None, tarfile.DIRTYPE, ""),
                f("pkg/m.py", b"y" * 100), link("pkg/latest", "m.py"),
                link("top", "pkg/../train.py")])
    sha = hashlib.sha256(data).hexdigest()
    r = post(client, data)
    assert r.status_code == 201, r.text
    rec = r.json()
    assert rec["sha256"] == sha and rec["size"] == len(data) and rec["kind"] == "tar.gz"
    assert rec["name"] == "work.tar.gz" and rec["file_count"] == 5
    assert rec["unpacked_bytes"] == 9 + 100 and rec["owner"] == "local"
    again = post(client, data, "renamed.tgz")
    assert again.status_code == 200 and again.json() == rec
    rows, files, audit = stored(settings)
    assert len(rows) == 1 and files == [f"{sha}.tar.gz"]
    assert [(a.target, a.actor) for a in audit] == [(sha, "local")]
    got = client.get(f"/api/uploads/{sha}").json()
    assert got["entries"] == ["train.py", "pkg", "pkg/m.py", "pkg/latest", "top"]
    assert client.get(f"/api/uploads/{'0' * 64}").status_code == 404
    assert client.get("/api/uploads/..").status_code in (404, 422)
    # the worker channel: the bytes, with the worker credential only
    w = client.get(f"/api/internal/uploads/{sha}", headers={"Authorization": f"Bearer {WORKER}"})
    assert w.status_code == 200 and w.content == data
    assert client.get(f"/api/internal/uploads/{sha}").status_code == 401
    assert client.get(f"/api/internal/uploads/{sha}",
                      headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get(f"/api/internal/uploads/{'a' * 64}",
                      headers={"Authorization": f"Bearer {WORKER}"}).status_code == 404


def test_quota_counts_what_the_user_owns(client, settings):
    a = tgz([f("a.bin", os.urandom(600_000))])  # incompressible: ~600 KB each
    b = tgz([f("b.bin", os.urandom(600_000))])
    assert post(client, a).status_code == 201
    assert post(client, a).status_code == 200  # the same bytes: no new space
    r = post(client, b)
    assert r.status_code == 403 and "PARALAB_UPLOAD_QUOTA_MB" in r.json()["detail"]
    rows, files, _ = stored(settings)
    assert len(rows) == 1 and len(files) == 1


@pytest.fixture
def team_settings(tmp_path, db_url) -> Settings:
    return Settings(data_dir=tmp_path / "var", database_url=db_url, worker_token=WORKER,
                    auth="required", secret_key=SECRET, **FAST_ARGON2, **LIMITS)


def test_team_mode_roles_and_ownership(team_settings):
    users = Users(team_settings)
    viewer, m1, m2 = (users.create("v", "viewer"), users.create("m1"), users.create("m2"))
    admin = users.create("adm", "admin")
    data = tgz([f("train.py")])
    with TestClient(create_app(team_settings)) as c:
        r = post(c, data, headers=viewer)
        assert r.status_code == 403 and "member role" in r.json()["detail"]
        big = post(c, os.urandom((1 << 20) + 1), headers=viewer)  # refused before it is read
        assert big.status_code == 403
        assert stored(team_settings) == ([], [], [])
        sha = post(c, data, headers=m1).json()["sha256"]
        assert c.get(f"/api/uploads/{sha}", headers=m1).status_code == 200
        assert c.get(f"/api/uploads/{sha}", headers=admin).status_code == 200
        assert c.get(f"/api/uploads/{sha}", headers=m2).status_code == 404
        assert c.get(f"/api/uploads/{sha}", headers=viewer).status_code == 404
        # a user token is not the worker credential
        assert c.get(f"/api/internal/uploads/{sha}", headers=admin).status_code == 401
