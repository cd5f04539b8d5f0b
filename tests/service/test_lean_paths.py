"""`paralab submit --wait` waits on the run's event stream (GET /live's `end`), not a poll:
with every sleep refused, the wait still ends when the run does, after one GET for the final
state."""

from __future__ import annotations

import pytest

from backend.cli import client
from tests.conftest import embedded_service


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    yield from embedded_service(tmp_path_factory.mktemp("cli-wait"))


def test_wait_is_woken_by_the_stream_not_a_poll(svc, monkeypatch):
    monkeypatch.setenv("PARALAB_URL", svc.url)
    run = svc.submit({"preset": "ddp", "name": "waited", "train": {"steps": 3}})

    def no_sleep(s):
        raise AssertionError(f"the wait polled (sleep {s} s)")

    gets = []
    real = client._request

    def counted(method, path, **kw):
        gets.append(path)
        return real(method, path, **kw)

    monkeypatch.setattr(client.time, "sleep", no_sleep)
    monkeypatch.setattr(client, "_request", counted)
    done = client._wait(run)
    assert done["status"] == "succeeded", done.get("error")
    assert gets == [f"/api/runs/{run['id']}"]  # one read, after the stream's `end`


def test_trace_bytes_cross_the_wire_once(svc):
    """The traces shipped live are recorded from the backend's copy when the job ends, not
    uploaded again: the run's file list has them, at the worker's size and with the sha256 of
    the bytes the backend holds, and the worker says so."""
    import hashlib
    run = svc.submit({"preset": "ddp", "name": "sealed", "train": {"steps": 3}})
    done = svc.wait_status(run["id"], ("succeeded", "failed"), 180)
    assert done["status"] == "succeeded", done["error"]
    files = {f["path"]: f for f in svc.http.get(f"/api/runs/{run['id']}/files").json()}
    for rank in (0, 1):
        name = f"trace-rank{rank}.jsonl"
        body = svc.http.get(f"/api/runs/{run['id']}/files/{name}").content
        assert files[name]["size"] == len(body) > 0
        assert files[name]["sha256"] == hashlib.sha256(body).hexdigest()
    log = svc.http.get(f"/api/runs/{run['id']}/logs").text
    assert ("trace-rank0.jsonl, trace-rank1.jsonl: shipped live while the job ran, recorded "
            "without a second upload") in log


def test_the_cli_imports_httpx_without_its_own_command_line():
    """`paralab`'s process loads httpx but not httpx's console script (click, rich, pygments:
    backend/cli/_httpx.py), and the client still speaks HTTP with it (a Client is made)."""
    import subprocess
    import sys
    code = ("import sys, backend.cli.client as c; "
            "print(sorted(m for m in ('click', 'rich', 'pygments') if m in sys.modules)); "
            "print(type(c._client(False)).__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60).stdout.split("\n")
    assert out[0] == "[]" and out[1] == "Client", out
