"""Run a train spec under torchrun the way the worker does for faults (docs/faults.md): poll
the ranks' flight files for progress (`last_progress_ns`), and when none came for
`runtime.hang_timeout_s` send SIGUSR1 to every rank (faulthandler stacks), wait, stop the
job, then diagnose. A run that exits by itself is diagnosed with torchrun's exit codes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from jobs.analysis.diagnose import diagnose, exit_codes_from_log, last_progress_ns, read_flights
from jobs.torchrun import MODULE as TORCHRUN
from tests.support.launch import ROOT, free_port

BASE = {"model": {"arch": "mlp", "hidden": 8, "layers": 2},
        "train": {"steps": 5, "global_batch": 8, "optimizer": "sgd"}}


HANG_S = 4.0  # the hang watch of a run expected to hang: short, so the test is quick
SAFETY_S = 60.0  # ... of a run expected to end by itself: only a safety net. A short one would
# turn a slow exit on a loaded machine (a rank's error handling, torchrun stopping its peer)
# into a false "hung": the watch is a wall clock, and only a hang may depend on it.


def spec(world: int, faults: list[dict], *, parallel: dict | None = None, steps: int = 5,
         hang_timeout_s: float = HANG_S) -> dict:
    s = json.loads(json.dumps(BASE))
    s["parallel"] = {"dp": world, "dp_mode": "allreduce", **(parallel or {})}
    s["train"]["steps"] = steps
    s["runtime"] = {"nproc_per_node": world, "hang_timeout_s": hang_timeout_s}
    s["faults"] = faults
    return s


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover
        return True
    try:  # a zombie (exited, not yet reaped by torchrun) is gone for our purpose
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][0] != "Z"
    except OSError:
        return False


def run_faulty(out: Path, spec_dict: dict, *, limit_s: float = 120.0) -> dict:
    """Launch, watch, stop, diagnose. Returns {"status", "returncode", "stderr", "pids",
    "diagnosis"}; every rank process is gone when it returns."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "spec.json").write_text(json.dumps(spec_dict))
    world = spec_dict["runtime"]["nproc_per_node"]
    timeout = float(spec_dict["runtime"].get("hang_timeout_s") or 0)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", TORCHRUN, "--standalone", "--nproc-per-node",
            str(world), "--master-port", str(free_port()), "-m", "jobs.train",
            "--spec", str(out / "spec.json"), "--out", str(out)]
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    status, t_start, pids = None, time.time(), set()
    while proc.poll() is None:
        time.sleep(0.25)
        flights = read_flights(out)
        pids |= {f["pid"] for f in flights.values() if f.get("pid")}
        last = last_progress_ns(out)
        now = time.time_ns()
        since = (now - last) / 1e9 if last else time.time() - t_start
        if timeout and since > timeout and last is not None and any(map(_alive, pids)):
            status = "hung"
            break
        if time.time() - t_start > limit_s:
            status = "timeout"
            break
    if status is not None:  # stacks first, then stop the whole job
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGUSR1)
        time.sleep(1.0)
        # ranks run in sessions of their own (torchrun) and a rank blocked inside a collective
        # never runs its Python SIGTERM handler: stop them with SIGKILL, then torchrun
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    stdout, stderr = proc.communicate(timeout=30)
    for pid in pids:  # torchrun stops its ranks; make sure, then check
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    deadline = time.time() + 10
    while any(_alive(p) for p in pids) and time.time() < deadline:
        time.sleep(0.1)
    if status is None:
        status = "completed" if proc.returncode == 0 else "failed"
    codes = exit_codes_from_log(stderr)
    diag = diagnose(out, status=status, exit_codes=codes)
    return {"status": status, "returncode": proc.returncode, "stdout": stdout,
            "stderr": stderr, "pids": sorted(pids), "alive": [p for p in pids if _alive(p)],
            "diagnosis": diag}
