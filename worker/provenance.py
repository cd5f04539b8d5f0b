"""What a run was produced by: paralab's commit, Python, torch, backend, devices, host."""

from __future__ import annotations

import os
import platform
import shutil
import socket
import subprocess
from functools import lru_cache
from importlib import metadata
from pathlib import Path

_REPO = Path(__file__).resolve().parent.parent


@lru_cache
def paralab_commit() -> str:
    if os.environ.get("PARALAB_COMMIT"):
        return os.environ["PARALAB_COMMIT"]
    try:
        out = subprocess.run(["git", "-C", str(_REPO), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=5)
        if out.returncode == 0:
            dirty = subprocess.run(["git", "-C", str(_REPO), "status", "--porcelain",
                                    "--untracked-files=no"], capture_output=True, text=True,
                                   timeout=5).stdout.strip()
            return out.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown cpu"


@lru_cache
def devices() -> list[dict]:
    """CUDA devices from nvidia-smi (no CUDA init in the worker), else the host's CPU."""
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=index,name,memory.total,driver_version",
                 "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10)
            gpus = []
            for line in out.stdout.strip().splitlines():
                idx, name, mem_mib, driver = [x.strip() for x in line.split(",")]
                gpus.append({"type": "cuda", "index": int(idx), "name": name,
                             "memory_bytes": int(float(mem_mib)) * 1024 * 1024,
                             "driver": driver})
            if gpus:
                return gpus
        except (OSError, subprocess.SubprocessError, ValueError):
            pass
    import psutil
    return [{"type": "cpu", "index": 0, "name": _cpu_model(), "cores": os.cpu_count(),
             "memory_bytes": psutil.virtual_memory().total, "driver": platform.release()}]


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def provenance(job_backend: str | None = None, job_info: dict | None = None) -> dict:
    devs = devices()
    return {
        "paralab_commit": paralab_commit(),
        "python": platform.python_version(),
        "torch": _version("torch"),
        "backend": job_backend,
        **(job_info or {}),
        "device": devs[0]["name"],
        "driver": devs[0].get("driver"),
        "devices": devs,
        "host": socket.gethostname(),
        "platform": platform.platform(),
    }
