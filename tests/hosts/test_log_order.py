"""A run's log is in arrival order (`seq`), never in the time its hosts stamped on a line
(issue 43, miss 6): two nodes whose clocks disagree by an hour, and a one-host run whose clock
stepped back, on both databases, without processes. Expected by hand: the backend numbers a
multi-host run's lines in the order their batches arrive (crud.append_node_logs), a one-host
run's lines carry the worker's own seq; crud.logs_after, crud.log_page and GET .../logs read
them in that order, whatever the timestamps say."""

from __future__ import annotations

import pytest

from backend import crud
from backend.core.db import get_sessionmaker
from backend.services import placement
from tests.hosts.test_placement_unit import gang, hosts, sent_to, submit

AHEAD, BEHIND = "2026-01-01T13:00:00+00:00", "2026-01-01T12:00:00+00:00"  # node 0, node 1


@pytest.fixture
def db(settings):
    with get_sessionmaker(settings.db_url)() as session:
        yield session


def _batch(first: int, n: int, ts_min: str, tag: str) -> list[dict]:
    """n lines with node seqs first.., stamped one second apart from ts_min (HH:MM:ss)."""
    return [{"seq": first + i, "ts": ts_min.replace(":00:00+", f":00:{10 + i:02d}+"),
             "line": f"[default0]:{tag} {first + i}"} for i in range(n)]


# (node, batch) in arrival order, and the run's log it must read as: node 0's clock is an hour
# ahead, so by timestamp node 1's lines (which arrived between node 0's) would come first
ARRIVALS = [(0, _batch(0, 2, AHEAD, "a")), (1, _batch(0, 2, BEHIND, "b")),
            (0, _batch(2, 2, AHEAD, "a"))]
EXPECTED = ["[hostA node0] [default0]:a 0", "[hostA node0] [default0]:a 1",
            "[hostB node1] [default0]:b 0", "[hostB node1] [default0]:b 1",
            "[hostA node0] [default0]:a 2", "[hostA node0] [default0]:a 3"]


def test_node_logs_read_in_arrival_order_whatever_their_clocks(db, settings, client):
    hosts(db)
    run = submit(db, gang())
    placement.place_waiting(db, settings, sent_to([]))
    for node, lines in ARRIVALS:
        assert crud.append_node_logs(db, run.id, node, lines) == len(lines)
    got = crud.logs_after(db, run.id)
    assert [(x.seq, x.line) for x in got] == list(enumerate(EXPECTED))
    assert [x.ts.hour for x in got] == [13, 13, 12, 12, 13, 13]  # the clocks disagree, kept
    assert [x.line for x in crud.logs_after(db, run.id, after=1, limit=2)] == EXPECTED[2:4]
    assert [line for _, _, line in crud.log_page(db, run.id)] == EXPECTED
    assert [line for _, _, line in crud.log_page(db, run.id, 3, limit=2)] == EXPECTED[4:]
    r = client.get(f"/api/runs/{run.id}/logs")
    assert r.status_code == 200, r.text
    assert r.text.splitlines() == EXPECTED


def test_a_clock_stepped_back_keeps_the_workers_order(db):
    run = submit(db, {"preset": "ddp", "model": {"arch": "mlp"}, "train": {"steps": 2}})
    stamps = ["2026-01-01T12:00:05", "2026-01-01T12:00:06", "2026-01-01T11:59:50",
              "2026-01-01T11:59:51"]  # NTP stepped the clock back between lines 1 and 2
    lines = [{"seq": i, "ts": t, "line": f"[default0]:line {i}"} for i, t in enumerate(stamps)]
    assert crud.append_logs(db, run.id, lines) == 4
    assert [x.line for x in crud.logs_after(db, run.id)] == [
        f"[default0]:line {i}" for i in range(4)]
    assert [x.seq for x in crud.logs_after(db, run.id, rank=0, after=0)] == [1, 2, 3]
