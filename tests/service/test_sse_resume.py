"""SSE log stream on a LIVE run: a run keeps logging while a client reads, disconnects and
reconnects with Last-Event-ID; it gets only the later lines, none twice, none lost. A real
HTTP server (uvicorn in a thread), since the stream never ends while the run goes on."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
import uvicorn

from backend import crud
from backend.core.db import get_sessionmaker
from backend.main import create_app
from jobs.spec import parse_spec
from tests.conftest import free_port, wait_for

LINES = 40


@pytest.fixture
def server(settings):
    port = free_port()
    config = uvicorn.Config(create_app(settings), host="127.0.0.1", port=port,
                            log_level="warning", lifespan="on")
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    wait_for(lambda: srv.started, 30, "uvicorn to start")
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    thread.join(10)


def _events(response, stop):
    """(id, data) of each `data` event until stop(ids) is true or the stream ends."""
    ids, event_id, kind = [], None, "message"
    for line in response.iter_lines():
        if line.startswith("id: "):
            event_id = int(line[4:])
        elif line.startswith("event: "):
            kind = line[7:]
        elif line == "":
            if kind == "end":
                return ids, True
            if event_id is not None and kind == "message":
                ids.append(event_id)
                if stop(ids):
                    return ids, False
            event_id, kind = None, "message"
    return ids, False


def test_sse_resumes_after_last_event_id_on_a_live_run(settings, server):
    maker = get_sessionmaker(settings.db_url)
    with maker() as db:
        rid = crud.create_run(db, parse_spec({"preset": "ddp"}), owner="local", tags=[],
                              notes="").id
        assert crud.claim(db, rid, worker="w@h", task_id=None) == (True, "claimed")
    first_batch = threading.Event()

    def keep_logging():  # the worker side, through the worker channel: a line every 50 ms
        h = {"Authorization": f"Bearer {settings.worker_token}"}
        with httpx.Client(base_url=server, timeout=30, headers=h) as w:
            for seq in range(LINES):
                w.post(f"/api/internal/runs/{rid}/logs",
                       json={"lines": [{"seq": seq, "line": f"[rank0]: line {seq}"}]}
                       ).raise_for_status()
                if seq == 9:
                    first_batch.set()
                time.sleep(0.05)
            w.post(f"/api/internal/runs/{rid}/finish",
                   json={"status": "succeeded", "exit_code": 0}).raise_for_status()

    writer = threading.Thread(target=keep_logging, daemon=True)
    writer.start()
    assert first_batch.wait(30)
    with httpx.Client(base_url=server, timeout=30) as http:
        with http.stream("GET", f"/api/runs/{rid}/logs/stream") as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            first, ended = _events(r, lambda ids: len(ids) >= 12)
        assert not ended, "the run was still logging: the stream must not have ended"
        last = first[-1]
        with maker() as db:
            assert crud.get_run(db, rid).status == "running"  # still live at reconnect
        time.sleep(0.3)  # lines keep coming while the client is away
        with http.stream("GET", f"/api/runs/{rid}/logs/stream",
                         headers={"Last-Event-ID": str(last)}) as r:
            second, ended = _events(r, lambda ids: False)
    writer.join(30)
    assert ended, "the stream ends with `event: end` once the run has finished"
    assert first == list(range(last + 1))
    assert second == list(range(last + 1, LINES))  # only later lines, each once, none lost
