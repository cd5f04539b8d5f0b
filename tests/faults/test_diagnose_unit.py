"""The diagnosis and the straggler figures on synthetic run folders with known answers (no
torch, no processes): flight files, faulthandler dumps, error files, torchrun's report."""

from __future__ import annotations

import json

import pytest
from pytest import approx

from devtools.oracle import analyze
from jobs.analysis.diagnose import diagnose, exit_codes_from_log, last_progress_ns, ranks_text
from jobs.analysis.stacks import parse_faulthandler, stack_summary
from jobs.analysis.storage.load import from_records
from tests.analysis.synth import comm, meta, span

MS = 1_000_000


def entry(seq, step, op="all_reduce", size=256, end=True, t=0):
    return {"seq": seq, "op": op, "payload_bytes": size, "dtype": "float32", "group_size": 4,
            "ts_ns": t or (seq + 1) * MS, "step": step, "end_ns": (seq + 2) * MS if end else None}


def flight(rank, ring, *, world=4, ranks=(0, 1, 2, 3), step=None, done=None, **extra):
    open_ = [e for e in ring if e["end_ns"] is None]
    last = [e for e in ring if e["end_ns"] is not None]
    return {"rank": rank, "pid": 100 + rank, "world_size": world,
            "coords": {"pp": 0, "dp": rank, "tp": 0},
            "step": step if step is not None else (ring[-1]["step"] if ring else -1),
            "steps_completed": done if done is not None else 0,
            "last_progress_ns": max([e["end_ns"] for e in last] + [1]),
            "updated_ns": 0, "closed": None, "exit": None, "nonfinite": None, **extra,
            "groups": {"dp": {"ranks": list(ranks), "issued": len(ring),
                              "completed": len(last), "open": len(open_),
                              "in_flight": open_[0] if open_ else None,
                              "last_completed": last[-1] if last else None, "ring": ring}}}


def write(d, flights, stacks=None, errors=None):
    for r, f in flights.items():
        (d / f"flight-rank{r}.json").write_text(json.dumps(f))
    for r, t in (stacks or {}).items():
        (d / f"stack-rank{r}.txt").write_text(t)
    for r, t in (errors or {}).items():
        (d / f"error-rank{r}.txt").write_text(t)
    return d


STACK = '''Thread 0x00007f0000000002 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 331 in wait
  File "/repo/jobs/trace.py", line 386 in _flusher

Current thread 0x00007f0000000001 (most recent call first):
  File "/venv/site-packages/torch/distributed/distributed_c10d.py", line 5356 in barrier
  File "/repo/jobs/train.py", line 71 in run_in_group
  File "/repo/jobs/entry.py", line 29 in job_main
  File "/repo/jobs/train.py", line 92 in <module>
  File "<frozen runpy>", line 88 in _run_code
'''


def test_stack_parse_picks_the_training_thread_and_its_repo_frame():
    threads = parse_faulthandler(STACK + "\n" + STACK)  # two dumps: the last one counts
    assert len(threads) == 2
    s = stack_summary(STACK)
    assert s["where"] == "jobs/train.py:71 in run_in_group"
    assert s["innermost"].endswith("distributed_c10d.py:5356 in barrier")


def test_hang_names_the_rank_that_never_entered(tmp_path):
    steady = [entry(s, s // 2) for s in range(6)]
    waiting = steady + [entry(6, 3, end=False)]
    fl = {r: flight(r, waiting, done=3) for r in range(3)}
    fl[3] = flight(3, steady, done=3, step=3)
    d = diagnose(write(tmp_path, fl, stacks={3: STACK}), status="hung")
    assert d["waited_for"] == 3
    assert d["sentence"] == ("rank 3 never entered all_reduce #6 of group dp [0, 1, 2, 3] "
                             "(step 3); ranks 0-2 wait there; "
                             "rank 3 is in `run_in_group` at jobs/train.py:71")
    g = d["groups"][0]
    assert g["first_mismatch"]["seq"] == 6 and g["first_mismatch"]["odd_ranks"] == [3]
    assert [x["state"] for x in d["ranks"]][:3] == \
        ["waiting in all_reduce #6 of group dp [0, 1, 2, 3]"] * 3
    assert last_progress_ns(tmp_path) == 7 * MS


@pytest.mark.parametrize("codes", [{}, {0: -9, 1: -9, 2: -9}, {0: -15, 2: -9}])
def test_a_stopped_rank_that_was_waiting_is_waiting(tmp_path, codes):
    """The hang watch SIGKILLs the ranks, then stops torchrun: whether torchrun's report lists
    their deaths (-9) first is a race. Each rank's state is what it was doing, either way; a
    stopped rank in no collective is "stopped by signal N"."""
    steady = [entry(s, s // 2) for s in range(6)]
    fl = {r: flight(r, steady + [entry(6, 3, end=False)], done=3) for r in range(3)}
    fl[3] = flight(3, steady, done=3, step=3)
    d = diagnose(write(tmp_path, fl, stacks={3: STACK}), status="hung",
                 exit_codes={**codes, 3: -9} if codes else {})
    states = [x["state"] for x in d["ranks"]]
    assert states[:3] == ["waiting in all_reduce #6 of group dp [0, 1, 2, 3]"] * 3
    assert states[3] == ("stopped by signal 9" if codes else "running")
    assert d["waited_for"] == 3 and d["sentence"].startswith("rank 3 never entered")


def test_content_mismatch_and_skip(tmp_path):
    base = [entry(0, 0, size=256), entry(1, 0, size=32), entry(2, 1, size=256),
            entry(3, 1, size=32)]
    skipper = [base[0], base[1], {**base[3], "seq": 2}]  # its #2 is the others' #3
    fl = {0: flight(0, base, ranks=(0, 1, 2), world=3), 1: flight(1, skipper, ranks=(0, 1, 2),
                                                                     world=3),
          2: flight(2, base, ranks=(0, 1, 2), world=3)}
    d = diagnose(write(tmp_path, fl), status="hung")
    m = d["groups"][0]["first_mismatch"]
    assert m["seq"] == 2 and m["kind"] == "content" and m["skipped"] == [1]
    assert d["sentence"].startswith("rank 1 skipped all_reduce #2 of group dp [0, 1, 2] at "
                                    "step 1 (its #2 is the others' #3)")
    assert d["waited_for"] == 1


def test_crash_first_failure_leads_and_peer_errors_follow(tmp_path):
    ring = [entry(0, 0), entry(1, 1, end=False)]
    fl = {0: flight(0, ring, ranks=(0, 1), world=2, closed={"reason": "error", "ts_ns": 9}),
          1: flight(1, [entry(0, 0)], ranks=(0, 1), world=2, step=1,
                    closed={"reason": "error", "ts_ns": 5})}
    errors = {0: "rank 0: RuntimeError: Connection closed by peer [127.0.0.1]:1\n",
              1: 'rank 1: ValueError: bad batch\n\nTraceback (most recent call last):\n'
                 '  File "/repo/jobs/loop.py", line 58, in train_loop\n    x()\n'
                 '  File "/repo/jobs/faults.py", line 120, in at_step\n    raise\n'
                 'ValueError: bad batch\n'}
    d = diagnose(write(tmp_path, fl, errors=errors), status="failed",
                 exit_codes={0: 1, 1: 1})
    assert d["sentence"] == ("rank 1 raised ValueError: bad batch at jobs/loop.py:58 in "
                             "train_loop in step 1; rank 0 was waiting in all_reduce #1 of "
                             "group dp [0, 1]")
    assert [x["rank"] for x in d["left"]] == [1, 0]


def test_a_victims_peer_error_does_not_hide_the_hangs_cause(tmp_path):
    """Rank 1's data ran out after step 2: it left its loop and never entered all_reduce #6,
    where rank 0 waits; the hang watch's kill of rank 0 then closed rank 1's connection, so
    rank 1 wrote an error file too (a race, seen in CI). The cause stays the hang's (the
    rank that never entered, and why), not the victim's "connection closed"."""
    steady = [entry(s, s // 2) for s in range(6)]
    fl = {0: flight(0, steady + [entry(6, 3, end=False)], ranks=(0, 1), world=2, done=3),
          1: flight(1, steady, ranks=(0, 1), world=2, done=3, step=2)}
    errors = {1: "rank 1: RuntimeError: [../gloo/transport/tcp/pair.cc:553] Connection closed "
                 "by peer [127.0.0.1]:29500\n"}
    d = diagnose(write(tmp_path, fl, errors=errors), status="hung")
    assert d["sentence"].startswith("rank 1 never entered all_reduce #6 of group dp [0, 1]")
    assert "rank 1 completed 3 steps and left its loop" in d["sentence"]
    assert d["waited_for"] == 1
    assert [(x["rank"], x["lost_peer"]) for x in d["left"]] == [(1, True)]  # still listed


def test_nonfinite_names_the_source(tmp_path):
    ring = [entry(0, 0)]
    fl = {0: flight(0, ring, ranks=(0, 1), world=2,
                    nonfinite={"step": 2, "what": "params", "value": "nan"}),
          1: flight(1, ring, ranks=(0, 1), world=2,
                    nonfinite={"step": 2, "what": "loss", "value": "nan"})}
    d = diagnose(write(tmp_path, fl), status="failed")
    assert d["waited_for"] == 1
    assert d["sentence"].startswith("rank 1: non-finite local loss (nan) at step 2; rank 0 "
                                    "then held non-finite parameters")


def test_exit_codes_from_torchrun_report():
    log = """Failures:
[1]:
  time      : 2026-12-01_21:00:00
  host      : h
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 11)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-01_21:00:00
  host      : h
  rank      : 3 (local_rank: 3)
  exitcode  : 3 (pid: 14)
"""
    assert exit_codes_from_log(log) == {0: -15, 3: 3}
    assert ranks_text([2, 0, 1]) == "ranks 0-2" and ranks_text([0, 2]) == "ranks 0, 2"


def test_stragglers_late_and_caused_wait():
    """Four ranks, one all-reduce per step; rank 2 arrives 30 µs after rank 1 (the next
    latest), which arrives 10 µs after ranks 0 and 3: late 30 µs, others waited 40+30+40."""
    recs = {r: [meta(r, 4)] for r in range(4)}
    arrive = {0: 100, 1: 110, 2: 140, 3: 100}
    for step in range(3):
        base = step * 1000
        for r in range(4):
            recs[r].append(span(r, step, "step", base, base + 500, cat="step"))
            recs[r].append(comm(r, step, "all_reduce", base + arrive[r], base + 200, n=4,
                                payload=1024, seq=step))
    a = analyze(from_records(recs))
    rows = a["tables"]["collectives"]
    assert {r["last_rank"] for r in rows} == {2}
    assert rows[0]["late_s"] == approx(30e-6) and rows[0]["wait_s"] == approx(40e-6)
    assert rows[0]["others_wait_s"] == approx(110e-6)
    per = {r["rank"]: r for r in a["tables"]["straggler_ranks"]}
    assert per[2]["times_last"] == 2 and per[2]["late_s"] == approx(60e-6)  # steps 1-2
    assert per[2]["wait_share"] == 1.0 and per[0]["others_wait_s"] == 0
    assert per[2]["cost_per_step_s"] == approx(30e-6) and per[2]["late_steps"] == 2
    h = a["headline"]
    assert h["straggler_rank"] == 2 and h["straggler_cost_s"] == approx(30e-6)
    assert h["straggler_others_wait_s"] == approx(220e-6)
