"""Uploaded bodies go to disk as they arrive: a working-directory upload (POST /api/uploads)
and an import (POST /api/imports) past their byte limit are refused after reading about the
limit's worth of the body, not all of it, and leave no file behind; a body announced larger
than the limit is refused before a byte is read. The import's form is read from the stream in
whatever order its parts come, and its fields are checked as declared.

Oracles: how many bytes the test's own body generator handed out, and the data directory's
files (what a refused upload must not leave)."""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path

import pytest

from backend.errors import Invalid
from backend.services import imports, uploads

MiB = 1 << 20
CHUNK = 64 << 10
VIT = sorted((Path(__file__).resolve().parents[1] / "data" / "kineto" / "vit_2rank")
             .glob("*.json.gz"))


def multipart(parts: list[tuple[str, str | None, bytes]]) -> tuple[bytes, str]:
    """(body, content type) of (field, filename or None, value) parts, in the order given."""
    boundary = secrets.token_hex(12)
    out = []
    for name, filename, value in parts:
        disp = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        out += [f"--{boundary}\r\nContent-Disposition: {disp}\r\n".encode(),
                b"Content-Type: application/octet-stream\r\n" if filename else b"",
                b"\r\n", value, b"\r\n"]
    out.append(f"--{boundary}--\r\n".encode())
    return b"".join(out), f"multipart/form-data; boundary={boundary}"


class Body:
    """An async stream of the body in CHUNK pieces that counts what it handed out."""

    def __init__(self, body: bytes):
        self.body, self.sent = body, 0

    async def __aiter__(self):
        for i in range(0, len(self.body), CHUNK):
            piece = self.body[i:i + CHUNK]
            self.sent += len(piece)
            yield piece


def files_under(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file()] if folder.exists() else []


@pytest.mark.parametrize("kind", ["import", "upload"])
def test_a_body_over_the_limit_stops_being_read_and_leaves_nothing(settings, kind):
    big = b"x" * (16 * MiB)
    if kind == "import":
        settings.import_max_mb = 1
        body, ctype = multipart([("name", None, b"big"), ("files", "big.json", big)])
        receive, said = imports.receive, "over its limit of 1,048,576 bytes"
    else:
        settings.upload_max_mb = 1
        body, ctype = multipart([("file", "big.tar.gz", big)])
        receive, said = uploads.receive, "over the upload limit of 1,048,576 bytes"
    stream = Body(body)
    with pytest.raises(Invalid) as err:
        asyncio.run(receive(stream, ctype, None, settings))
    assert said in err.value.errors[0]["msg"], err.value.errors
    # the limit and the chunk being written, not the 16 MiB sent
    assert stream.sent <= MiB + 2 * CHUNK, stream.sent
    assert files_under(settings.data_dir) == []


@pytest.mark.parametrize("kind", ["import", "upload"])
def test_an_announced_body_over_the_limit_is_refused_before_a_byte(settings, kind):
    settings.import_max_mb = settings.upload_max_mb = 1
    body, ctype = multipart([("files" if kind == "import" else "file", "a.json", b"{}")])
    stream = Body(body)
    receive = imports.receive if kind == "import" else uploads.receive
    with pytest.raises(Invalid) as err:
        asyncio.run(receive(stream, ctype, str(64 * MiB), settings))
    assert "1,048,576 bytes" in err.value.errors[0]["msg"]
    assert stream.sent == 0 and files_under(settings.data_dir) == []


def post(client, parts):
    body, ctype = multipart(parts)
    return client.post("/api/imports", content=body, headers={"content-type": ctype})


def test_the_import_form_is_read_in_any_order_and_checked(client, settings):
    traces = [("files", p.name, p.read_bytes()) for p in VIT]
    # fields after the files, a tag given twice: as FastAPI's form parsing took them
    r = post(client, [*traces, ("tags", None, b"a"), ("name", None, b"vit last"),
                      ("tags", None, b"b"), ("allow_missing_ranks", None, b"true")])
    assert r.status_code == 201, r.text
    run = r.json()
    assert (run["name"], sorted(run["tags"]), run["kind"]) == ("vit last", ["a", "b"], "import")
    assert files_under(settings.data_dir / "imports") == []
    before = files_under(settings.data_dir)
    for parts, loc in (([*traces, ("allow_missing_ranks", None, b"true")], "name"),
                       ([("name", None, b"x"), *traces, ("allow_missing_ranks", None, b"maybe")],
                        "allow_missing_ranks"),
                       ([("name", None, b"x")], "files"),
                       ([("name", None, b"x"), ("files", "notes.txt", b"hi")], "files")):
        r = post(client, parts)
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["loc"] == ["body", loc], r.json()
        assert files_under(settings.data_dir) == before  # nothing staged is left
    r = client.post("/api/imports", json={"name": "x"})  # not a form
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "files"]
