"""Each fault kind on a real torchrun job (gloo, a 2-layer MLP under dp-allreduce: one
all-reduce per parameter tensor, four per step, so step s issues seqs 4s .. 4s + 3): the
diagnosis names the right rank, group, op and seq (or the straggler), and no rank process is
left behind.
The harness (harness.py) watches the job like the worker: flight files for progress,
SIGUSR1 for stacks, then stop, then diagnose."""

from __future__ import annotations

import json

import pytest

from jobs.analysis import write_analysis
from jobs.analysis.diagnose import DIAGNOSIS_FILE, write_diagnosis
from tests.faults.harness import SAFETY_S, run_faulty, spec

STEP = 2
SEQ = 4 * STEP  # the first collective of step 2: every step issues 4 all-reduces


def _run(tmp_path, world, faults, **kw):
    r = run_faulty(tmp_path / "run", spec(world, faults, **kw))
    assert r["alive"] == [], "rank processes left behind"
    assert r["pids"], "no flight file named a process"
    return r, r["diagnosis"]


def _group(d, key="dp"):
    return next(g for g in d["groups"] if g["key"] == key)


def test_hang_names_the_rank_that_never_entered(tmp_path):
    r, d = _run(tmp_path, 4, [{"kind": "hang", "ranks": [3], "step": STEP, "op": "all_reduce"}])
    assert r["status"] == "hung"
    assert d["waited_for"] == 3
    assert d["sentence"].startswith(f"rank 3 never entered all_reduce #{SEQ} of group dp "
                                    "[0, 1, 2, 3]")
    assert "ranks 0-2 wait there" in d["sentence"]
    m = _group(d)["first_mismatch"]
    assert m["seq"] == SEQ and m["kind"] == "entry" and m["odd_ranks"] == [3]
    states = {x["rank"]: x["state"] for x in d["ranks"]}
    assert all(states[k] == f"waiting in all_reduce #{SEQ} of group dp [0, 1, 2, 3]"
               for k in range(3))
    assert d["ranks"][3]["stack"].startswith("jobs/parallel/base.py")  # stacks were dumped
    assert "Thread" in d["stacks"][0]
    write_diagnosis(tmp_path / "run", status="hung")
    assert json.loads((tmp_path / "run" / DIAGNOSIS_FILE).read_text())["waited_for"] == 3


def test_hang_in_one_of_two_tp_groups(tmp_path):
    """tp = 2 x dp = 2 (gpt): rank 3 blocks before a step-1 tensor-parallel all-reduce. Rank 2
    waits in that tp group, ranks 0 and 1 in their dp groups; the diagnosis picks the group
    rank 3 would have entered next (its own step-0 order) and the right instance of `tp`."""
    s = spec(4, [{"kind": "hang", "ranks": [3], "step": 1, "group": "tp"}],
             parallel={"dp": 2, "tp": 2, "dp_mode": "ddp"}, steps=3)
    s["model"] = {"arch": "gpt", "layers": 1, "hidden": 16, "heads": 2, "seq_len": 8,
                  "vocab": 64}
    r = run_faulty(tmp_path / "run", s)
    assert r["alive"] == [] and r["status"] == "hung"
    d = r["diagnosis"]
    assert d["waited_for"] == 3
    tp = next(g for g in d["groups"] if g["label"] == "tp [2, 3]")
    seq = tp["first_mismatch"]["seq"]
    assert tp["first_mismatch"]["odd_ranks"] == [3]
    assert d["sentence"].startswith(f"rank 3 never entered all_reduce #{seq} of group tp "
                                    "[2, 3] (step 1); rank 2 waits there")
    assert next(g for g in d["groups"] if g["label"] == "tp [0, 1]")["first_mismatch"] is None


@pytest.mark.parametrize("mode", ["exception", "exit"])
def test_crash_names_the_failing_rank_and_where_the_others_waited(tmp_path, mode):
    r, d = _run(tmp_path, 2, [{"kind": "crash", "ranks": [1], "step": STEP, "mode": mode,
                               "exit_code": 7}], hang_timeout_s=SAFETY_S)
    assert r["status"] == "failed"
    assert d["waited_for"] == 1 and d["left"][0]["rank"] == 1
    if mode == "exception":
        assert d["sentence"].startswith("rank 1 raised InjectedCrash: injected crash")
        assert "at jobs/loop.py:" in d["sentence"]
    else:
        assert d["sentence"].startswith("rank 1 exited with code 7")
        assert d["left"][0]["exit_code"] == 7
    assert f"in step {STEP}" in d["sentence"]
    assert f"rank 0 was waiting in all_reduce #{SEQ} of group dp [0, 1]" in d["sentence"]


def test_a_crash_waits_for_a_slow_peer_to_block(tmp_path):
    """Rank 0 computes 1.5 s longer in the crash's step: fired at once, rank 1's exit would
    have the agent stop rank 0 mid-compute (no collective to name); the crash waits until rank
    0's flight file shows it blocked, so the diagnosis says where it waited. The real-time
    run of the feature; the wait itself is checked on a virtual clock in
    test_fault_clock.py."""
    r, d = _run(tmp_path, 2, [
        {"kind": "crash", "ranks": [1], "step": STEP, "mode": "exit", "exit_code": 7},
        {"kind": "slow", "ranks": [0], "step": STEP, "mode": "compute", "delay_s": 1.5}],
        hang_timeout_s=SAFETY_S)
    assert r["status"] == "failed" and d["waited_for"] == 1
    assert f"rank 0 was waiting in all_reduce #{SEQ} of group dp [0, 1]" in d["sentence"]


def test_skip_names_the_first_disagreeing_position(tmp_path):
    r, d = _run(tmp_path, 2, [{"kind": "skip_collective", "ranks": [1], "step": STEP,
                               "op": "all_reduce"}])
    m = _group(d)["first_mismatch"]
    assert m["seq"] == SEQ and m["kind"] == "content" and m["odd_ranks"] == [1]
    # rank 1's #SEQ is what the others issue as #SEQ+1: the next parameter's (smaller) tensor
    assert m["per_rank"][1]["payload_bytes"] != m["per_rank"][0]["payload_bytes"]
    assert m["skipped"] == [1]  # its step-2 sequence is step 1's shifted by one
    assert d["sentence"].startswith(f"rank 1 skipped all_reduce #{SEQ} of group dp [0, 1] at "
                                    f"step {STEP}")
    assert d["waited_for"] == 1


@pytest.mark.parametrize("mode", ["size", "op"])
def test_mismatch_names_rank_op_and_seq(tmp_path, mode):
    r, d = _run(tmp_path, 2, [{"kind": "mismatch", "ranks": [1], "step": STEP,
                               "op": "all_reduce", "mode": mode}])
    m = _group(d)["first_mismatch"]
    assert m["seq"] == SEQ and m["odd_ranks"] == [1] and d["waited_for"] == 1
    mine, theirs = m["per_rank"][1], m["per_rank"][0]
    if mode == "size":
        assert mine["op"] == "all_reduce" and mine["payload_bytes"] * 2 == theirs["payload_bytes"]
    else:
        assert mine["op"] == "broadcast" and theirs["op"] == "all_reduce"
    assert d["sentence"].startswith(f"dp [0, 1] disagrees at #{SEQ}: rank 1 issued "
                                    f"{mine['op']} of {mine['payload_bytes']} B")


def test_data_exhausted_names_the_rank_that_stopped(tmp_path):
    r, d = _run(tmp_path, 2, [{"kind": "data_exhausted", "ranks": [1], "step": STEP}])
    assert r["status"] == "hung" and d["waited_for"] == 1
    assert d["sentence"].startswith(f"rank 1 never entered all_reduce #{SEQ} of group dp "
                                    f"[0, 1] (step {STEP})")
    assert f"rank 1 completed {STEP} steps and left its loop" in d["sentence"]
    assert "is in `run_in_group` at jobs/train.py:" in d["sentence"]  # the end-of-run barrier


@pytest.mark.parametrize("mode", ["nan", "inf"])
def test_nonfinite_names_the_source_rank_and_step(tmp_path, mode):
    r, d = _run(tmp_path, 2, [{"kind": "nonfinite", "ranks": [1], "step": STEP, "mode": mode}],
                hang_timeout_s=SAFETY_S)
    assert r["status"] == "failed"
    assert d["waited_for"] == 1
    assert d["nonfinite"][1]["what"] == "loss" and d["nonfinite"][1]["step"] == STEP
    assert d["nonfinite"][0]["what"] == "params"  # through the gradient all-reduce
    assert d["sentence"].startswith(f"rank 1: non-finite local loss ({mode}) at step {STEP}")
    assert "FloatingPointError" in d["errors"][1]


def test_slow_rank_is_the_straggler(tmp_path):
    """The one real-time run of the slow fault (the delays, the straggler figures and both
    modes are checked exactly on a virtual clock in test_fault_clock.py): a real sleep in
    the loop's step shows in the traced arrival times and names rank 1. Who is late only,
    never how fast anything is: 0.5 s a step is far beyond this job's step-to-step noise."""
    r, d = _run(tmp_path, 2, [{"kind": "slow", "ranks": [1], "step": 1, "steps": 3,
                               "delay_s": 0.5, "mode": "compute"}], steps=4,
                hang_timeout_s=SAFETY_S)
    assert r["status"] == "completed", r["stderr"][-2000:]
    h = write_analysis(tmp_path / "run")
    assert h["straggler_rank"] == 1 and h["straggler_flagged_steps"] >= 2
    a = json.loads((tmp_path / "run" / "analysis.json").read_text())
    per = {x["rank"]: x for x in a["tables"]["straggler_ranks"]}
    assert per[1]["times_last"] >= 3 and per[1]["late_steps"] == 3  # each steady step
    assert per[1]["late_s"] > per[0]["late_s"]
