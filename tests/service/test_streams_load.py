"""Open run pages do not starve the service (issue 13): 50 live log streams stay open on a
running run while the history answers, and a line posted through the worker channel reaches
every one of them. On SQLite and PostgreSQL; with Redis, two backend processes share the
events (the worker's report reaches one, the streams hang on the other).

Behaviour checks: generous timeouts only, no latency is asserted (bench/streams.py measures)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.conftest import REDIS_URL, Service

STREAMS = 50


# Streams re-read the database only every 10 minutes here: a line that reaches them within
# the tests' timeouts came through the fan-out (in process, or through Redis).
QUIET = {"PARALAB_RUN_HEARTBEAT_TIMEOUT_S": "600", "PARALAB_STREAM_RECHECK_S": "600"}


def _service(tmp_path, db_url, **kw) -> Service:
    svc = Service(tmp_path, db_url=db_url, redis_url=kw.pop("redis_url", None), extra_env=QUIET)
    svc.start_backend()
    return svc


async def _stream(url: str, run_id: str, seen: list, opened: asyncio.Event, want: str,
                  n_open: list) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(60)) as c:
        async with c.stream("GET", f"/api/runs/{run_id}/logs/stream") as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if line == "data: running" and not opened.is_set():
                    n_open.append(1)
                    if len(n_open) == STREAMS:
                        opened.set()
                if line == f"data: {want}":
                    seen.append(1)
                    return


async def _scenario(stream_url: str, svc: Service, run_id: str) -> tuple[int, list[int]]:
    h = {"Authorization": f"Bearer {svc.env['PARALAB_WORKER_TOKEN']}"}
    async with httpx.AsyncClient(base_url=svc.url, timeout=60, headers=h) as worker:
        r = await worker.post(f"/api/internal/runs/{run_id}/claim",
                              json={"worker": "test", "task_id": None})
        assert r.json()["launch"], r.text
        seen, n_open, opened = [], [], asyncio.Event()
        tasks = [asyncio.create_task(_stream(stream_url, run_id, seen, opened, "hello 1",
                                             n_open)) for _ in range(STREAMS)]
        await asyncio.wait_for(opened.wait(), 120)
        # the history answers while every stream waits
        async with httpx.AsyncClient(base_url=svc.url, timeout=30) as c:
            codes = [(await c.get("/api/runs", params={"limit": 50})).status_code
                     for _ in range(10)]
            codes += [(await c.get(f"/api/runs/{run_id}")).status_code for _ in range(10)]
        r = await worker.post(f"/api/internal/runs/{run_id}/logs",
                              json={"lines": [{"seq": 0, "line": "hello 0"},
                                              {"seq": 1, "line": "hello 1"}]})
        assert r.status_code == 200, r.text
        await asyncio.wait_for(asyncio.gather(*tasks), 120)
        return len(seen), codes


def test_fifty_open_streams_leave_the_api_answering(tmp_path, db_url):
    svc = _service(tmp_path, db_url)
    try:
        run_id = svc.submit({"preset": "ddp", "name": "watched"})["id"]
        got, codes = asyncio.run(_scenario(svc.url, svc, run_id))
        assert codes == [200] * 20
        assert got == STREAMS
    finally:
        svc.close()


def test_streams_on_another_backend_process_get_the_lines_through_redis(tmp_path,
                                                                        pg_server_url):
    pytest.importorskip("redis")
    from tests.conftest import _fresh_pg_database
    url, drop = _fresh_pg_database(pg_server_url)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = _service(tmp_path / "a", url, redis_url=REDIS_URL)
    b = Service(tmp_path / "b", db_url=url, redis_url=REDIS_URL,
                extra_env={**QUIET, "PARALAB_WORKER_TOKEN": a.env["PARALAB_WORKER_TOKEN"],
                           "PARALAB_QUEUE": a.queue})
    try:
        b.start_backend()
        run_id = a.submit({"preset": "ddp", "name": "watched elsewhere"})["id"]
        got, codes = asyncio.run(_scenario(b.url, a, run_id))  # streams on b, reports to a
        assert got == STREAMS and codes == [200] * 20
    finally:
        b.close()
        a.close()
        drop()
