"""Boundaries of the analysis rules on tiny synthetic inputs whose answers are written by hand
(no torch, no processes, no run folders beyond a tmp dir):

- a rank's next collective comes from its PREVIOUS step's program order (steps repeat);
- a non-finite loss is reported at the FIRST step any rank saw one, not the last;
- the wait a straggler caused is last − first arrival (wait_s), not last − second-latest
  (late_s), so a rank that is last by a wide margin once outweighs one that is last twice by a
  hair behind a near-equal peer;
- a rank flagged in exactly STRAGGLER_MIN_STEP_SHARE (half) of the steady steps is named the
  run's straggler (">=" in docs/analysis.md's rule)."""

from __future__ import annotations

import json

from pytest import approx

from devtools.oracle.stragglers import stragglers_table
from jobs.analysis import rules
from jobs.analysis.diagnose import diagnose
from jobs.analysis.sequences import next_group
from jobs.analysis.stragglers import straggler_of_flags

MS = 1_000_000


def _e(seq: int, step: int, t_ms: int) -> dict:
    return {"seq": seq, "op": "all_reduce", "payload_bytes": 256, "dtype": "float32",
            "group_size": 2, "ts_ns": t_ms * MS, "step": step, "end_ns": (t_ms + 1) * MS}


def test_next_group_follows_the_previous_steps_order():
    # step 2 issued, in time order: tp, dp, tp. Step 3 has issued one (tp) so far, so the
    # next one is the second of step 2's: dp; after two (tp, dp) it is tp; after three, unknown.
    tp = [_e(0, 2, 10), _e(1, 2, 30), _e(2, 3, 35)]
    f = {"step": 3, "groups": {"dp": {"ring": [_e(0, 2, 20)]}, "tp": {"ring": tp}}}
    assert next_group(f) == "dp"
    # step 3 then issued dp too: two done -> the third of step 2's order
    dp = [_e(0, 2, 20), _e(1, 3, 36)]
    f2 = {"step": 3, "groups": {"dp": {"ring": dp}, "tp": {"ring": tp}}}
    assert next_group(f2) == "tp"
    f3 = {"step": 3, "groups": {"dp": {"ring": dp + [_e(2, 3, 50)]}, "tp": {"ring": tp}}}
    assert next_group(f3) is None
    assert next_group(None) is None


def _flight(rank: int, nonfinite: dict) -> dict:
    ring = [_e(0, 0, 1)]
    return {"rank": rank, "pid": 100 + rank, "world_size": 2,
            "coords": {"pp": 0, "dp": rank, "tp": 0}, "step": 6, "steps_completed": 6,
            "last_progress_ns": 2 * MS, "updated_ns": 0, "closed": None, "exit": None,
            "nonfinite": nonfinite,
            "groups": {"dp": {"ranks": [0, 1], "issued": 1, "completed": 1, "open": 0,
                              "in_flight": None, "last_completed": ring[-1], "ring": ring}}}


def test_nonfinite_is_reported_at_the_first_step(tmp_path):
    # rank 1's loss went NaN at step 3; rank 0's only at step 5 (a later symptom): the
    # diagnosis names rank 1 at step 3.
    fl = {0: _flight(0, {"step": 5, "what": "loss", "value": "nan"}),
          1: _flight(1, {"step": 3, "what": "loss", "value": "inf"})}
    for r, f in fl.items():
        (tmp_path / f"flight-rank{r}.json").write_text(json.dumps(f))
    d = diagnose(tmp_path, status="failed")
    assert d["waited_for"] == 1
    assert d["sentence"].startswith("rank 1: non-finite local loss (inf) at step 3; rank 0 "), \
        d["sentence"]


def _coll(step, last, wait_s, late_s):
    return {"step": step, "ranks": [0, 1, 2], "op": "all_reduce", "last_rank": last,
            "wait_s": wait_s, "late_s": late_s, "others_wait_s": 2 * wait_s - late_s,
            "clock_error_s": 0.0}


def test_caused_wait_is_last_minus_first_arrival():
    # step 0, two all_reduces over ranks 0..2, step time 10 s.
    # #1: arrivals 0.0 (r0), 0.9 (r2), 1.0 (r1): last r1, wait 1.0, late 0.1
    # #2: arrivals 0.0 (r0), 0.0 (r1), 0.4 (r2): last r2, wait 0.4, late 0.4
    # caused wait by rank: r1 1.0, r2 0.4 -> r1, fraction 0.1 (>= 5 %: flagged)
    rows = stragglers_table([_coll(0, 1, 1.0, 0.1), _coll(0, 2, 0.4, 0.4)],
                            [{"step": 0, "step_s": 10.0}])
    assert len(rows) == 1
    r = rows[0]
    assert (r["rank"], r["times_last"], r["flagged"]) == (1, 1, True)
    assert r["caused_wait_s"] == approx(1.0)
    assert r["wait_fraction"] == approx(0.1)


def test_flagged_in_exactly_half_the_steady_steps_is_the_straggler():
    assert rules.STRAGGLER_MIN_STEP_SHARE == 0.5
    out = straggler_of_flags({3: [0.1, 0.3]}, 4)  # 2 of 4 steady steps
    assert out == {"rank": 3, "flagged_steps": 2, "steps": 4,
                   "caused_wait_median_s": approx(0.2)}
    # one step fewer than half: not named, the count still reported
    assert straggler_of_flags({3: [0.1]}, 3) == {"rank": None, "flagged_steps": 1, "steps": 3,
                                                 "caused_wait_median_s": None}
