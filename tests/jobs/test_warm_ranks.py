"""Warm ranks (jobs/torchrun.py): paralab's own job modules start each rank from a fork server
that imported torch once (torch's function entrypoint, start_method "forkserver") instead of a
new interpreter. The oracle is torchrun's default launch, every rank its own `python -u`
(PARALAB_RANK_START=exec): the same results, the same exit statuses and failure report, and a
rank that looks like a new process to the job (signal handlers, unbuffered output, found by the
worker's hang watch)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from jobs.torchrun import (
    MODULE,
    RANK_COMM,
    START_ENV,
    cuda_host,
    forking,
    rank_main,
    warm,
)
from tests.support.hold import until_exists
from tests.support.launch import ROOT, free_port, read_trace, torchrun
from worker.hang import rank_pids
from worker.procs import PROC_KEY

ARGS = ["--spec", "S", "--out", "O"]


@pytest.mark.parametrize("mode,cmd,want", [
    ("", ["-u", "-m", "jobs.train", *ARGS], ["module", "jobs.train", *ARGS]),
    ("", ["-u", "-m", "jobs.collective_bench", *ARGS], ["module", "jobs.collective_bench", *ARGS]),
    ("exec", ["-u", "-m", "jobs.train", *ARGS], None),  # torchrun's own way, on request
    ("", ["-u", "-m", "jobs.script_runner", *ARGS], None),  # a user's script: never forked
    ("fork", ["-u", "-m", "jobs.script_runner", *ARGS], None),
    ("", ["-u", "-m", "tests.jobs.multirun", "--specs", "S"], None),  # only when asked
    ("fork", ["-u", "-m", "tests.jobs.multirun", "--specs", "S"],
     ["module", "tests.jobs.multirun", "--specs", "S"]),
    ("", ["-u", "/x/worker.py", "a"], None),
    ("fork", ["-u", "/x/worker.py", "a"], ["path", "/x/worker.py", "a"]),
    ("fork", ["-u", "/bin/true"], None),  # not a Python script
    ("fork", ["-u", "-m", "jobs.train"], ["module", "jobs.train"]),
    ("fork", ["true"], None),  # --no-python: a command of its own
])
def test_which_launches_fork_their_ranks(mode, cmd, want):
    assert warm(cmd, {START_ENV: mode} if mode else {}) == want


def _config(cmd_args):
    return lambda args: (SimpleNamespace(start_method="spawn"), "/py", cmd_args)


@pytest.mark.parametrize("cuda", [False, True])
def test_a_cuda_host_keeps_torchruns_own_launch(cuda):
    """On a host with a CUDA device every rank gets its own interpreter, torchrun's default (the
    branch this CPU machine cannot take for real: forked GPU ranks are not tested here)."""
    cmd = ["-u", "-m", "jobs.collective_bench", *ARGS]
    cfg, fn, args = forking(_config(cmd), cuda=lambda: cuda)(None)
    if cuda:
        assert (cfg.start_method, fn, args) == ("spawn", "/py", cmd)
    else:
        assert (cfg.start_method, fn, args) == ("forkserver", rank_main,
                                                ["module", "jobs.collective_bench", *ARGS])


def test_asking_for_cuda_initialises_nothing_and_leaves_the_environment(monkeypatch):
    monkeypatch.delenv("PYTORCH_NVML_BASED_CUDA_CHECK", raising=False)
    assert cuda_host() is torch.cuda.is_available()
    assert "PYTORCH_NVML_BASED_CUDA_CHECK" not in os.environ
    assert not torch.cuda.is_initialized()


PROBE = '''
import os, signal, sys
PRELOADED = "torch" in sys.modules  # first line: a new interpreter has imported nothing yet
import json
from jobs.entry import exit_now
out, how = sys.argv[1], sys.argv[2]
rank = os.environ["RANK"]
with open(f"{out}/probe-{rank}.json", "w") as f:
    json.dump({"preloaded": PRELOADED, "comm": open("/proc/self/comm").read().strip(),
               "term": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
               "int": signal.getsignal(signal.SIGINT) is signal.default_int_handler,
               "key": os.environ.get("PARALAB_PROCS"), "argv": sys.argv[1:],
               "name": __name__, "path0": sys.path[0]}, f)
print(f"rank {rank} says hello", end="")
print(" in one line")
if how == "raise" and rank == "1":
    raise ValueError("boom from the probe")
if how == "exit" and rank == "1":
    exit_now(3)
exit_now(0)
'''


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("probe")
    (d / "probe.py").write_text(PROBE)
    return d / "probe.py"


def _launch(probe: Path, out: Path, mode: str, how: str = "ok"):
    out.mkdir(parents=True, exist_ok=True)
    return torchrun(2, [str(probe), str(out), how], timeout=120,
                    env={START_ENV: mode, PROC_KEY: f"probe-{mode}"})


@pytest.mark.parametrize("mode", ["fork", "exec"])
def test_a_forked_rank_looks_like_a_new_process_to_its_script(probe, tmp_path, mode):
    p = _launch(probe, tmp_path, mode)
    assert p.returncode == 0, p.stderr[-3000:]
    for r in (0, 1):
        got = json.loads((tmp_path / f"probe-{r}.json").read_text())
        assert got["preloaded"] is (mode == "fork")  # the point: torch came with the fork
        assert got["comm"] == RANK_COMM if mode == "fork" else got["comm"] != RANK_COMM
        assert got["term"] and got["int"], got  # not the agent's SignalException handlers
        assert got["key"] == f"probe-{mode}" and got["argv"] == [str(tmp_path), "ok"]
        assert got["name"] == "__main__" and got["path0"] == str(probe.parent)
        assert f"rank {r} says hello in one line\n" in p.stdout


@pytest.mark.parametrize("how,code,says", [("raise", 1, "ValueError: boom from the probe"),
                                           ("exit", 3, None)])
def test_a_failing_forked_rank_fails_the_launch_as_an_exec_d_one_does(probe, tmp_path, how,
                                                                       code, says):
    for mode in ("fork", "exec"):
        p = _launch(probe, tmp_path / mode, mode, how)
        assert p.returncode == 1, (mode, p.stderr[-3000:])  # torchrun's status for a failure
        assert "ChildFailedError" in p.stderr and "rank      : 1 (local_rank: 1)" in p.stderr
        if says:  # the rank's traceback on its stderr, whichever way it started
            assert says in p.stderr, (mode, p.stderr[-3000:])
        else:
            assert f"exitcode  : {code}" in p.stderr, (mode, p.stderr[-3000:])


def test_a_warm_job_trains_exactly_as_torchruns_default_launch(tmp_path):
    """jobs.train forks its ranks by default; the same spec with every rank exec'd is the
    oracle: the same losses and gradients' effect, bit for bit (fp32, gloo, one thread)."""
    spec = {"preset": "ddp", "train": {"steps": 3}}
    losses = {}
    for mode in ("", "exec"):  # "": the default, as the worker launches jobs.train
        out = tmp_path / (mode or "default")
        out.mkdir()
        (out / "spec.json").write_text(json.dumps(spec))
        p = torchrun(2, ["-m", "jobs.train", "--spec", str(out / "spec.json"), "--out",
                         str(out)], env={START_ENV: mode}, inherit=False, timeout=240)
        assert p.returncode == 0, p.stderr[-3000:]
        losses[mode] = json.loads((out / "summary.json").read_text())["loss"]
        assert {r["type"] for r in read_trace(out, 1)} >= {"comm", "span", "end"}
    assert losses[""] == losses["exec"] and len(losses[""]) == 3


def _ppid(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("PPid:")[1].split()[0])


def test_the_hang_watch_finds_forked_ranks_by_name(probe, tmp_path):
    """worker/hang.py rank_pids: a forked rank's /proc environment is the agent's (no RANK), so
    it is found by its name; neither the agent nor the fork server is a rank."""
    hold = tmp_path / "release"
    script = tmp_path / "hold.py"
    script.write_text("import os, sys, time\n"
                      f"open({str(tmp_path)!r} + '/up-' + os.environ['RANK'], 'w').close()\n"
                      f"while not os.path.exists({str(hold)!r}): time.sleep(0.05)\n")
    key = f"hold-{os.getpid()}"
    env = {**os.environ, START_ENV: "fork", PROC_KEY: key, "PYTHONPATH": str(ROOT),
           "OMP_NUM_THREADS": "1"}
    agent = subprocess.Popen([sys.executable, "-m", MODULE, "--nproc-per-node", "2",
                              "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
                              str(script)], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        assert until_exists(str(tmp_path / "up-0")) and until_exists(str(tmp_path / "up-1"))
        pids = rank_pids(key)
        assert len(pids) == 2 and agent.pid not in pids, pids
        server = {_ppid(pid) for pid in pids}  # forked by the fork server, the agent's child
        assert len(server) == 1
        srv = server.pop()
        assert _ppid(srv) == agent.pid
        # ... itself a fork of the agent (in_process: one thread there), not a new interpreter
        cmdline = Path(f"/proc/{srv}/cmdline").read_bytes()
        assert cmdline == Path(f"/proc/{agent.pid}/cmdline").read_bytes(), cmdline
    finally:
        hold.touch()
        agent.wait(timeout=60)
    assert agent.returncode == 0


SPAWN = """
import json, os, sys, threading
from jobs.torchrun import in_process
keep_r, keep_w = os.pipe()
drop_r, drop_w = os.pipe()  # what the fork must not keep, as exec with close_fds would not
exec_d = []
spawn = in_process(lambda path, args, fds: exec_d.append(args) or -1)
code = ("from multiprocessing.util import debug; import os; "
        f"os.write({keep_w}, repr(sorted(map(int, os.listdir('/proc/self/fd')))).encode()); "
        "raise SystemExit(3)")
pid = spawn(sys.executable, [sys.executable, "-c", code], [keep_w])
os.close(keep_w)
fds = eval(os.read(keep_r, 4096))
status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
threaded = threading.Event()
t = threading.Thread(target=threaded.wait)
t.start()
again = spawn(sys.executable, [sys.executable, "-c", code], [keep_w])
threaded.set()
t.join()
other = spawn(sys.executable, [sys.executable, "-c", "import os"], [])
print(json.dumps({"fds": fds, "kept": keep_w, "dropped": [drop_r, drop_w], "status": status,
                  "pid": pid, "again": again, "other": other, "exec_d": len(exec_d)}))
"""


def test_a_helper_forked_in_process_keeps_only_its_fds_and_falls_back_with_threads():
    """in_process, multiprocessing's helper started as a fork: only the descriptors it is
    passed (and 0-2) stay open, its SystemExit code is its status, and with a second thread
    alive, or for code not multiprocessing's, the exec'd start is used instead."""
    p = subprocess.run([sys.executable, "-c", SPAWN], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout)
    assert got["kept"] in got["fds"] and not set(got["dropped"]) & set(got["fds"]), got
    assert len(set(got["fds"]) - {0, 1, 2, got["kept"]}) <= 1, got  # listdir's own
    assert got["status"] == 3 and got["pid"] > 0
    assert got["again"] == -1 and got["other"] == -1 and got["exec_d"] == 2
