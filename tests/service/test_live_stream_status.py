"""GET /live sends a status change at once: the window that coalesces a burst of trace growth
into one `traces` event (TRACE_EVENTS_S) is left as soon as the run's status changes, so a
finished run's `end` (what `paralab submit --wait` and the run page wait on) is never held
back by it. The window is made an hour long here: a stream that still slept through it would
not answer within the test's 30 s guard."""

from __future__ import annotations

import asyncio

from backend import crud
from backend.api.routes.runs import streams
from backend.core.db import get_sessionmaker
from backend.streams import hub


def _events(chunk: str) -> list[tuple[str, str]]:
    out = []
    for block in chunk.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines()
                      if ": " in line and not line.startswith(":"))
        if "event" in fields:
            out.append((fields["event"], fields.get("data", "")))
    return out


def test_a_status_change_ends_the_trace_window_at_once(client, settings, monkeypatch):
    monkeypatch.setattr(streams, "TRACE_EVENTS_S", 3600.0)
    rid = client.post("/api/runs", json={"preset": "ddp", "name": "live"}).json()["id"]
    with get_sessionmaker(settings.db_url)() as db:
        crud.claim(db, rid, worker="w", task_id=None)

    async def scenario() -> list[tuple[str, str]]:
        resp = await streams.stream_live(None, rid, settings)
        body = resp.body_iterator
        got: list[tuple[str, str]] = []

        async def next_events():
            while True:
                if evs := _events(await asyncio.wait_for(body.__anext__(), 30)):
                    got.extend(evs)
                    return evs

        assert [e for e, _ in await next_events()][0] == "status"  # running, first thing
        while got[-1][0] != "traces":  # the first traces event (the version it starts at)
            await next_events()
        hub.publish_event(rid)  # the traces grew: the stream is now in its hour-long window
        nxt = asyncio.ensure_future(next_events())
        await asyncio.sleep(0.2)  # let it enter the window (it must not answer before)
        assert not nxt.done(), got
        with get_sessionmaker(settings.db_url)() as db:
            crud.finish(db, rid, status="succeeded", exit_code=0, error=None, summary=None,
                        provenance={})
        hub.publish_status(rid, "succeeded")
        await nxt
        while got[-1][0] != "end":
            await next_events()
        await body.aclose()
        return got

    got = asyncio.run(scenario())
    assert ("status", "succeeded") in got and got[-1] == ("end", "succeeded"), got
    # one traces event per burst: the growth inside the window is not sent on its own
    assert [e for e, _ in got].count("traces") <= 2, got
