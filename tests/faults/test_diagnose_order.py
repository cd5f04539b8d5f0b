"""Who failed first when the victim's error is earlier in time (issue 43, miss 4): a rank
that only reports its peer's failure ("Connection closed by peer", "Connection reset by
peer", gloo's / NCCL's wording) is never the cause, even when its error time comes first (the
ranks' clocks are aligned to rank 0's only roughly, and a peer's socket can close before the
failing rank's own error file is written). Synthetic run folders, answers by hand."""

from __future__ import annotations

from jobs.analysis.diagnose import diagnose, failure_text
from tests.faults.test_diagnose_unit import entry, flight, write

BAD = ('rank 1: ValueError: bad batch\n\nTraceback (most recent call last):\n'
       '  File "/repo/jobs/loop.py", line 58, in train_loop\n    x()\n'
       'ValueError: bad batch\n')


def test_the_real_failure_leads_although_the_peer_error_is_earlier(tmp_path):
    ring = [entry(0, 0), entry(1, 1, end=False)]
    # rank 0 (the victim) closed at t = 5, rank 1 (the cause) at t = 9
    fl = {0: flight(0, ring, ranks=(0, 1), world=2, closed={"reason": "error", "ts_ns": 5}),
          1: flight(1, [entry(0, 0)], ranks=(0, 1), world=2, step=1,
                    closed={"reason": "error", "ts_ns": 9})}
    errors = {0: "rank 0: RuntimeError: Connection closed by peer [127.0.0.1]:1\n", 1: BAD}
    d = diagnose(write(tmp_path, fl, errors=errors), status="failed", exit_codes={0: 1, 1: 1})
    assert [x["rank"] for x in d["left"]] == [1, 0]
    assert [x["lost_peer"] for x in d["left"]] == [False, True]
    assert d["waited_for"] == 1
    assert d["sentence"] == ("rank 1 raised ValueError: bad batch at jobs/loop.py:58 in "
                             "train_loop in step 1; rank 0 was waiting in all_reduce #1 of "
                             "group dp [0, 1]")
    assert failure_text(d).splitlines()[0] == "rank 1: ValueError: bad batch"


def test_three_ranks_two_victims_earlier_than_the_cause(tmp_path):
    """Victims at t = 1 and 2, the cause at t = 3: the cause leads, then the victims in time
    order."""
    ring = [entry(0, 0), entry(1, 1, end=False)]
    ranks = (0, 1, 2)
    fl = {0: flight(0, ring, ranks=ranks, world=3, closed={"reason": "error", "ts_ns": 2}),
          1: flight(1, [entry(0, 0)], ranks=ranks, world=3, step=1,
                    closed={"reason": "error", "ts_ns": 3}),
          2: flight(2, ring, ranks=ranks, world=3, closed={"reason": "error", "ts_ns": 1})}
    errors = {0: "rank 0: RuntimeError: Connection reset by peer\n", 1: BAD,
              2: "rank 2: RuntimeError: [/gloo/transport/tcp/pair.cc:534] Connection closed "
                 "by peer [127.0.0.1]:2\n"}
    d = diagnose(write(tmp_path, fl, errors=errors), status="failed")
    assert [x["rank"] for x in d["left"]] == [1, 2, 0]
    assert d["sentence"].startswith("rank 1 raised ValueError: bad batch")
