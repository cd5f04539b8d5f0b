"""jobs/torchrun.py: torch's launcher with its exit status, without the interpreter's teardown."""

from __future__ import annotations

import subprocess
import sys

import pytest

import jobs.torchrun
from jobs.torchrun import MODULE, exit_code
from tests.conftest import ROOT


def test_the_module_name_the_launchers_use_is_its_own():
    assert MODULE == jobs.torchrun.__name__


@pytest.mark.parametrize("code,want", [(None, 0), (0, 0), (2, 2), (5, 5), ("bad args", 1)])
def test_a_system_exit_ends_as_the_interpreter_would_end_it(code, want, capsys):
    assert exit_code(SystemExit(code)) == want
    assert capsys.readouterr().err == ("bad args\n" if code == "bad args" else "")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", MODULE, "--nproc-per-node", "1", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1",
                               "PYTHONPATH": str(ROOT)})


def test_exit_status_and_report_are_torchruns():
    ok = _run("--no-python", "true")
    assert ok.returncode == 0, ok.stderr
    failed = _run("--no-python", "false")  # a rank that fails: torchrun's report, status 1
    assert failed.returncode == 1
    assert "ChildFailedError" in failed.stderr and "exitcode  : 1" in failed.stderr, \
        failed.stderr
    bad = _run("--no-such-option")  # argparse's usage error
    assert bad.returncode == 2 and "usage: torchrun" in bad.stderr, bad.stderr
