"""GPU paths of the data-parallel family: CUDA-event timing, allocator peaks, NCCL.

    python bench/gpu_check.py [--out DIR]

Skips (exit 0, with the reason) where CUDA is absent. With CUDA:
  1. Tracer on CUDA: a device-timed span around GPU work resolves to `clock: cuda_event`, a
     positive device duration, and memory records carry `cuda_peak_allocated_bytes`.
  2. The job on NCCL through torchrun, one rank per GPU (1 GPU: dp=1; >= 2: ddp and zero3 on
     min(GPUs, 4) ranks, reference and native, bf16 too): summaries written, losses equal
     across strategies, comm records present on the `dp` axis.
Prints one line per check and exits non-zero on the first failure.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from devtools.launch import torchrun  # noqa: E402


def check(cond: bool, what: str) -> None:
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        sys.exit(1)


def tracer_on_cuda(out: Path) -> None:
    import torch

    from jobs.trace import Tracer
    tr = Tracer(out, 0, 1, sync_clock=False)
    tr.step = 0
    a = torch.randn(4096, 4096, device="cuda")
    with tr.span("matmul"):
        for _ in range(10):
            a = a @ a
            a = a / a.norm()
    tr.memory(phase="after", params=0)
    tr.close()
    recs = [json.loads(x) for x in (out / "trace-rank0.jsonl").read_text().splitlines()]
    meta = recs[0]
    span = next(r for r in recs if r["type"] == "span")
    mem = next(r for r in recs if r["type"] == "mem")
    check(meta["clock"] == "cuda_event", "tracer uses CUDA events on GPU")
    check(span["dur_ns"] > 0 and "host_dur_ns" in span,
          f"device span {span['dur_ns'] / 1e6:.3f} ms (host {span['host_dur_ns'] / 1e6:.3f} ms)")
    check(mem["cuda_peak_allocated_bytes"] >= 3 * 4096 * 4096 * 4 // 2,
          f"allocator peak {mem['cuda_peak_allocated_bytes'] / 2**20:.0f} MiB")


def job(out: Path, nproc: int, name: str, parallel: dict, train: dict | None = None) -> dict:
    spec = {"model": {"arch": "mlp", "hidden": 512, "layers": 4},
            "parallel": {"dp": nproc, **parallel},
            "train": {"steps": 3, "global_batch": 32, **(train or {})},
            "runtime": {"nproc_per_node": nproc, "backend": "nccl"}}
    d = out / name
    d.mkdir(parents=True)
    (d / "spec.json").write_text(json.dumps(spec))
    p = torchrun(nproc, ["-m", "jobs.train", "--spec", str(d / "spec.json"), "--out", str(d)],
                 timeout=300)
    check(p.returncode == 0, f"job {name} on NCCL x{nproc}" + ("" if p.returncode == 0 else
                                                                 "\n" + p.stderr[-2000:]))
    s = json.loads((d / "summary.json").read_text())
    trace = [json.loads(x) for x in (d / "trace-rank0.jsonl").read_text().splitlines()]
    check(trace[0]["clock"] == "cuda_event" and trace[0]["backend"] == "nccl",
          f"{name}: trace on cuda_event clock")
    if nproc > 1:
        check(any(r["type"] == "comm" and r["axis"] == "dp" for r in trace),
              f"{name}: dp comm records")
    mem = s["ranks"][0]["process_memory"]
    check(mem.get("cuda_peak_allocated_bytes", 0) > 0, f"{name}: allocator peak in summary")
    return s


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    import torch
    if not torch.cuda.is_available():
        print("skipped: CUDA is not available on this machine (CPU-only torch or no GPU)")
        return
    out = Path(args.out or tempfile.mkdtemp(prefix="gpu_check-"))
    out.mkdir(parents=True, exist_ok=True)
    tracer_on_cuda(out / "tracer")
    n = min(torch.cuda.device_count(), 4)
    if n == 1:
        job(out, 1, "single", {})
        return
    losses = {}
    for name, par, tr in [("ddp", {"dp_mode": "ddp"}, None),
                          ("zero3", {"zero_stage": 3}, None),
                          ("ddp-native", {"dp_mode": "ddp", "engine": "native"}, None),
                          ("fsdp", {"zero_stage": 3, "engine": "native"}, None),
                          ("zero2-bf16", {"zero_stage": 2}, {"precision": "bf16"})]:
        losses[name] = job(out, n, name, par, tr)["loss"]
    ref = losses["ddp"]
    for name in ("zero3", "ddp-native", "fsdp"):
        check(all(abs(a - b) <= 1e-4 * max(1.0, abs(b)) for a, b in zip(losses[name], ref,
                                                                          strict=True)),
              f"{name}: losses equal ddp's {losses[name]}")


if __name__ == "__main__":
    main()
