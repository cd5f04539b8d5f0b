"""A run file a worker uploads whole (PUT /api/internal/runs/{id}/files/{path}) goes to disk as
its body arrives, under a temporary name, and takes the file's place only once complete: a
large body arrives byte for byte, and one cut off, cancelled or refused mid-body (disk full)
leaves the path as it was (absent, or the previous complete copy) and no temporary file. On
the worker's side the file is sent from disk in pieces, and a retried upload sends it again
from its first byte.

Oracles: the test's own bytes and their sha256 (hashlib), the run folder's files as the test
reads them, and what a fake transport received."""

from __future__ import annotations

import asyncio
import hashlib
import random

import anyio
import httpx
import pytest
from fastapi.testclient import TestClient

from backend import storage
from backend.core.config import Settings
from backend.main import create_app
from backend.migrate import upgrade
from worker.client import BackendClient

MiB = 1 << 20
CHUNK = 64 << 10
TOKEN = "t" * 32
WORKER = {"Authorization": "Bearer " + TOKEN}
NAME = "traces/trace-rank0.jsonl"


@pytest.fixture
def settings(tmp_path):
    # SQLite only: what is tested is the file written, not the database
    url = f"sqlite:///{tmp_path / 'p.db'}"
    upgrade(url)
    return Settings(data_dir=tmp_path / "var", database_url=url, worker_token=TOKEN)


@pytest.fixture
def run(settings):
    """(TestClient, app, run id, the run's folder)."""
    app = create_app(settings)
    with TestClient(app, raise_server_exceptions=False) as client:
        rid = client.post("/api/runs", json={"preset": "ddp"}).json()["id"]
        yield client, app, rid, settings.runs_dir / rid


def data(n: int, seed: int = 7) -> bytes:
    return random.Random(seed).randbytes(n)


def files_in(folder) -> dict[str, int]:
    return {p.relative_to(folder).as_posix(): p.stat().st_size
            for p in folder.rglob("*") if p.is_file()} if folder.exists() else {}


async def put(app, rid: str, body) -> httpx.Response:
    """The upload with `body` (an async iterator) handed to the app one piece at a time, as a
    server hands a body on while it arrives (TestClient would read it whole first)."""
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
        return await c.put(f"/api/internal/runs/{rid}/files/{NAME}", content=body,
                           headers=WORKER, timeout=60)


def test_a_large_body_is_written_as_it_arrives_and_arrives_intact(run):
    client, app, rid, folder = run
    payload = data(5 * MiB + 123)
    target = folder / NAME
    seen = []

    async def body():
        for i in range(0, len(payload), CHUNK):
            # what the body has handed out so far is on disk, bar what is still being
            # gathered for a write (at most 2 MiB held), and not yet at the file's path
            on_disk = sum(files_in(folder).values())
            seen.append((i, on_disk, target.exists()))
            yield payload[i:i + CHUNK]

    r = asyncio.run(put(app, rid, body()))
    assert r.status_code == 200, r.text
    assert r.json() == {"path": NAME, "size": len(payload),
                        "sha256": hashlib.sha256(payload).hexdigest()}
    assert target.read_bytes() == payload
    assert files_in(folder) == {NAME: len(payload)}  # no temporary file left
    assert all(on_disk >= sent - 2 * MiB for sent, on_disk, _ in seen), seen
    assert not any(there for _, _, there in seen)
    got = client.get(f"/api/internal/runs/{rid}/files/{NAME}", headers=WORKER)
    assert got.status_code == 200 and got.content == payload


def old_copy(client, rid: str) -> bytes:
    """A complete earlier upload of the file, which a failed one must leave as it is."""
    old = data(3000, seed=1)
    assert client.put(f"/api/internal/runs/{rid}/files/{NAME}", content=old,
                      headers=WORKER).status_code == 200
    return old


def test_a_body_cut_off_mid_way_leaves_the_file_as_it_was(run):
    client, app, rid, folder = run
    old = old_copy(client, rid)

    async def body():
        for i in range(0, 3 * MiB, CHUNK):
            yield data(CHUNK, seed=i)
        raise ConnectionResetError("the worker's connection dropped")

    r = asyncio.run(put(app, rid, body()))
    assert r.status_code >= 500
    assert (folder / NAME).read_bytes() == old
    assert files_in(folder) == {NAME: len(old)}


def test_a_cancelled_upload_leaves_nothing(run):
    _, app, rid, folder = run
    halfway = anyio.Event()

    async def body():
        for i in range(0, 3 * MiB, CHUNK):
            yield data(CHUNK, seed=i)
        halfway.set()
        await anyio.sleep_forever()
        yield b""  # (never reached)

    async def main():
        async with anyio.create_task_group() as tg:
            tg.start_soon(put, app, rid, body())
            await halfway.wait()
            assert sum(files_in(folder).values()) >= MiB  # it was being written
            tg.cancel_scope.cancel()

    asyncio.run(main())
    assert files_in(folder) == {}


def test_a_write_refused_mid_body_is_a_507_and_leaves_the_file_as_it_was(run, tmp_path,
                                                                         monkeypatch):
    client, app, rid, folder = run
    old = old_copy(client, rid)
    flag = tmp_path / "full"
    monkeypatch.setenv(storage.TEST_DISK_FULL_ENV, str(flag))
    monkeypatch.setattr(storage, "last_failure", None)

    async def body():
        for i in range(0, 4 * MiB, CHUNK):
            if i == 2 * MiB:  # the disk fills up while the file is being written
                assert sum(files_in(folder).values()) > len(old)
                flag.touch()
            yield data(CHUNK, seed=i)

    r = asyncio.run(put(app, rid, body()))
    assert r.status_code == 507, r.text
    assert r.json()["detail"].startswith(f"could not write {folder / NAME}")
    flag.unlink()
    assert (folder / NAME).read_bytes() == old
    assert files_in(folder) == {NAME: len(old)}


class CutOnce(httpx.BaseTransport):
    """Receives each request's body piece by piece; the first attempt's connection drops after
    two pieces."""

    def __init__(self):
        self.attempts: list[list[bytes]] = []
        self.headers: list[httpx.Headers] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        pieces: list[bytes] = []
        self.attempts.append(pieces)
        self.headers.append(request.headers)
        for piece in request.stream:
            pieces.append(piece)
            if len(self.attempts) == 1 and len(pieces) == 2:
                raise httpx.WriteError("connection reset", request=request)
        return httpx.Response(200, json={"size": sum(map(len, pieces))})


def test_the_worker_streams_the_file_and_a_retry_starts_from_its_first_byte(tmp_path):
    payload = data(3 * MiB + 77, seed=3)
    f = tmp_path / "trace-rank0.jsonl"
    f.write_bytes(payload)
    transport = CutOnce()
    client = BackendClient("http://backend", TOKEN)
    client._http = httpx.Client(base_url="http://backend", transport=transport)
    try:
        client.upload("r1", "trace-rank0.jsonl", f)
    finally:
        client.close()
    first, again = transport.attempts
    assert len(first) == 2 and payload.startswith(b"".join(first))
    assert b"".join(again) == payload  # the whole file again, from its first byte
    assert len(again) > 1  # sent in pieces from the open file, not read whole first
    assert all(h["content-length"] == str(len(payload)) for h in transport.headers)
