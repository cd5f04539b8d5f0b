"""A user's script that hangs, run unmodified by jobs/script_runner.py on 2 gloo ranks while
the worker's hang watch (worker.hang.HangWatch) reads the flight files jobs/script_flight.py
keeps: the hang is detected, stacks are dumped on SIGUSR1, the job is killed and the
diagnosis (jobs/analysis/diagnose.py, as for presets) names the rank that never entered the
collective. The oracle is the script itself: it skips its explicit all_reduce (#2 of the
default group, one per step) on rank 1 at step 2. docs/scripts.md, "Hangs".
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jobs.analysis.diagnose import read_flights
from jobs.torchrun import MODULE as TORCHRUN
from tests.support.launch import ROOT, free_port, torchrun
from worker.hang import HangWatch, LogTail, post_mortem

SCRIPTS = ROOT / "tests" / "data" / "scripts"
WORLD = 2


def _spec(out: Path, entry: str, args: list[str]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    p = out / "spec.json"
    p.write_text(json.dumps({"name": entry, "kind": "script",
                             "runtime": {"nproc_per_node": WORLD},
                             "script": {"entry": entry, "args": args}}))
    return p


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][0] != "Z"
    except OSError:
        return False


def _kill(pids) -> None:
    for pid in pids:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
def test_skipped_all_reduce_is_detected_and_diagnosed(tmp_path):
    out = tmp_path / "run"
    spec = _spec(out, "hang_skip.py", ["--steps", "5", "--skip-at", "2", "--stall-s", "120"])
    argv = [sys.executable, "-m", TORCHRUN, "--nproc-per-node", str(WORLD),
            "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "-m",
            "jobs.script_runner", "--spec", str(spec), "--out", str(out),
            "--workdir", str(SCRIPTS)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    watch = HangWatch(out, timeout_s=3, poll_s=0.25)
    pids: set[int] = set()
    hung, limit = False, time.monotonic() + 180
    try:
        while proc.poll() is None and time.monotonic() < limit:
            time.sleep(0.25)
            pids |= {f["pid"] for f in read_flights(out).values() if f.get("pid")}
            if watch.stalled_s() is not None:
                hung = True
                break
        assert hung, (proc.returncode, proc.stderr.read()[-3000:] if proc.stderr else "")
        assert len(pids) == WORLD
        for pid in pids:  # the worker's dump_stacks, by pid (no run key in this test)
            os.kill(pid, signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not all(
                (out / f"stack-rank{r}.txt").exists()
                and (out / f"stack-rank{r}.txt").stat().st_size for r in range(WORLD)):
            time.sleep(0.1)
        time.sleep(0.3)
    finally:  # a rank blocked in a collective runs no Python handler: SIGKILL, then torchrun
        _kill(pids)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)
        deadline = time.monotonic() + 10
        while any(map(_alive, pids)) and time.monotonic() < deadline:
            time.sleep(0.1)
    assert not [p for p in pids if _alive(p)]

    diag = post_mortem(out, "hung", LogTail())
    assert diag is not None
    assert json.loads((out / "diagnosis.json").read_text())["sentence"] == diag["sentence"]
    assert diag["waited_for"] == 1, diag["sentence"]
    assert diag["sentence"].startswith(
        "rank 1 never entered all_reduce #2 of group world [0, 1] (step 2); rank 0 waits "
        "there"), diag["sentence"]
    states = {r["rank"]: r["state"] for r in diag["ranks"]}
    assert states[0] == "waiting in all_reduce #2 of group world [0, 1]", states
    # the stacks: rank 1 in the script's stall, rank 0 inside the script's all_reduce call
    assert "hang_skip.py" in diag["stacks"][1] and "stall" in diag["stacks"][1]
    assert "hang_skip.py" in diag["stacks"][0] and "all_reduce" in diag["stacks"][0]
    flights = read_flights(out)
    assert [flights[r]["steps_completed"] for r in range(WORLD)] == [2, 2]
    # torch's format beside the JSON view: rank 0's open all_reduce, started, never completed
    dump = pickle.loads((out / "flight" / "flight_rank_0").read_bytes())
    last = dump["entries"][-1]
    assert (last["profiling_name"], last["state"], last["collective_seq_id"]) == \
        ("gloo:all_reduce", "started", 2)
    assert last["input_sizes"] == [[1]] and last["input_dtypes"] == ["Float"]


@pytest.mark.slow
def test_a_run_that_completes_closes_its_flight_files(tmp_path):
    """ddp_linear.py (DDP's bucket all-reduces come from C++): steps are the progress seen;
    the files end closed 'ok', nothing open."""
    out = tmp_path / "ok"
    spec = _spec(out, "ddp_linear.py", ["--steps", "4"])
    proc = torchrun(WORLD, ["-m", "jobs.script_runner", "--spec", str(spec), "--out",
                            str(out), "--workdir", str(SCRIPTS)], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    flights = read_flights(out)
    assert sorted(flights) == [0, 1]
    for f in flights.values():
        assert f["steps_completed"] == 4 and f["closed"]["reason"] == "ok"
        assert all(g["open"] == 0 for g in f["groups"].values())
