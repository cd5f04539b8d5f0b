"""Launch a worker script under torchrun (gloo, CPU) with a free port; tests read its JSON."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(script: str, nproc: int, out: Path, *args: str, timeout: float = 600) -> dict:
    """Run tests/mp/<script> on `nproc` ranks; return rank 0's `result.json` from `out`."""
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
           str(ROOT / "tests" / "mp" / script), str(out), *args]
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise AssertionError(f"torchrun failed ({p.returncode}):\n{p.stdout[-3000:]}\n"
                             f"{p.stderr[-6000:]}")
    return json.loads((out / "result.json").read_text())
