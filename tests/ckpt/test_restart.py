"""Automatic restart (torchrun --max-restarts 1): rank 1 fails on attempt 0 (test-only env
vars of jobs/ckpt.py, until the faults feature's "crash" replaces them); attempt 1 continues
from the last complete checkpoint in OUT and ends with the uninterrupted run's losses. A rank
killed while saving leaves a checkpoint without its COMMITTED marker: it is never offered, and
the restart goes back to the one before."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from jobs.ckpt_index import attempts, complete_checkpoints
from jobs.torchrun import MODULE as TORCHRUN
from tests.ckpt.helpers import TOL, loss_gap
from tests.support.launch import ROOT, _raise, run_job

SPEC = {"preset": "ddp", "train": {"steps": 6, "checkpoint_every": 2}}


@pytest.fixture(scope="module")
def ref_run(tmp_path_factory):
    return run_job(tmp_path_factory.mktemp("ref"), SPEC, 2)


@pytest.fixture(scope="module")
def uninterrupted(ref_run):
    return json.loads((ref_run / "summary.json").read_text())["loss"]


def _restarting(out, env: dict, *args: str) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    (out / "spec.json").write_text(json.dumps(SPEC))
    # --standalone (c10d rendezvous on a free port), as worker/launch.py launches jobs
    argv = [sys.executable, "-m", TORCHRUN, "--standalone", "--nproc-per-node",
            "2", "--max-restarts", "1", "-m", "jobs.train", "--spec", str(out / "spec.json"),
            "--out", str(out), *args]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT),
                               **env})
    if proc.returncode != 0:
        _raise(proc, out)
    return json.loads((out / "summary.json").read_text())


def _meta(path) -> dict:
    return json.loads(path.read_text().splitlines()[0])


def test_crash_restarts_from_last_checkpoint(tmp_path, uninterrupted):
    s = _restarting(tmp_path, {"PARALAB_TEST_CRASH_AT_STEP": "4"})  # after step 4, before its save
    assert s["attempt"] == 1 and s["start_step"] == 4  # checkpoint of 4 steps (2, 4 saved)
    assert loss_gap(uninterrupted, s["loss"], 4) <= TOL
    a = attempts(tmp_path)
    assert [x["attempt"] for x in a] == [0, 1]
    assert a[0]["failed_ranks"][0]["rank"] == 1
    assert "RuntimeError: test crash" in a[0]["cause"] and a[0]["cause"].startswith("rank 1:")
    assert (a[0]["first_step"], a[0]["last_step"]) == (0, 4)
    assert (a[1]["first_step"], a[1]["last_step"], a[1]["cause"]) == (4, 5, None)
    # the final attempt's files are in OUT, the first attempt's under attempts/0
    assert _meta(tmp_path / "trace-rank1.jsonl")["attempt"] == 1
    assert _meta(tmp_path / "attempts" / "0" / "trace-rank1.jsonl")["attempt"] == 0
    assert not (tmp_path / "error-rank1.txt").exists()


def test_kill_while_saving_never_resumes_partial(tmp_path, uninterrupted):
    # attempt 0: rank 1 dies after DCP wrote step 4, before the marker: step-000004 partial
    s = _restarting(tmp_path, {"PARALAB_TEST_CRASH_BEFORE_COMMIT": "4"})
    assert s["attempt"] == 1 and s["start_step"] == 2  # not the partial step 4
    assert loss_gap(uninterrupted, s["loss"], 2) <= TOL
    resumed = _meta(tmp_path / "trace-rank0.jsonl")["resume_path"]
    assert resumed.endswith("step-000002")
    a = attempts(tmp_path)
    assert len(a) == 2 and "test kill while saving step 4" in a[0]["cause"]
    # attempt 1 saved step 4 again, whole this time
    assert [c["step"] for c in complete_checkpoints(tmp_path)] == [2, 4]
    assert complete_checkpoints(tmp_path)[1]["attempt"] == 1


def test_resume_from_the_command_line(tmp_path, ref_run, uninterrupted):
    """`jobs.train --resume` (what the worker passes): no failure, one attempt."""
    s = _restarting(tmp_path, {}, "--resume", str(ref_run / "checkpoints" / "step-000004"))
    assert (s["attempt"], s["start_step"], s["resumed_from"]) == (0, 4, 4)
    assert loss_gap(uninterrupted, s["loss"], 4) <= TOL
    assert [(a["attempt"], a["first_step"], a["cause"]) for a in attempts(tmp_path)] == \
        [(0, 4, None)]
    assert complete_checkpoints(tmp_path) == []  # 4 + 2 = 6 = the last step: nothing saved
