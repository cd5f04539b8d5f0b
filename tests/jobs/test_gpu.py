"""GPU paths (CUDA-event timing, allocator peaks, NCCL): bench/gpu_check.py, run where CUDA is."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from tests.support.launch import ROOT


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="needs a CUDA GPU (CUDA-event timing, allocator peaks, NCCL)")
def test_gpu_check(tmp_path):
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--out",
                        str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
