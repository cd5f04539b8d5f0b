"""Entry point of a training job, run on every rank by torchrun:

    torchrun --nproc-per-node N -m jobs.train --spec SPEC.json --out DIR

Writes `DIR/trace-rank{R}.jsonl` (one JSON object per line, schema in docs/trace-schema.md),
`DIR/summary.json` (rank 0) and, when a rank fails, `DIR/error-rank{R}.txt` with its traceback
so the worker can put the failing rank's error into the run's error text.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn

from jobs.spec import JobSpec, parse_spec


def make_model(spec: JobSpec) -> nn.Module:
    torch.manual_seed(spec.train.seed)
    h = spec.model.hidden
    layers: list[nn.Module] = []
    for _ in range(spec.model.layers):
        layers += [nn.Linear(h, h), nn.ReLU()]
    layers.append(nn.Linear(h, 1))
    return nn.Sequential(*layers)


def global_batch(spec: JobSpec, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The samples of one global batch depend only on the seed and step, never on the layout."""
    g = torch.Generator().manual_seed(spec.train.seed * 1_000_003 + step)
    x = torch.randn(spec.train.global_batch, spec.model.hidden, generator=g)
    y = x.sum(dim=1, keepdim=True).sin()
    return x, y


class TraceWriter:
    def __init__(self, path: Path, rank: int):
        self.rank = rank
        self._f = open(path, "w", buffering=1 << 16)

    def write(self, **rec) -> None:
        rec["rank"] = self.rank
        self._f.write(json.dumps(rec) + "\n")

    def close(self) -> None:
        self._f.close()


def run(spec: JobSpec, out: Path) -> None:
    backend = spec.runtime.backend
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if backend == "nccl" \
        else torch.device("cpu")
    trace = TraceWriter(out / f"trace-rank{rank}.jsonl", rank)
    trace.write(type="meta", world_size=world, backend=backend, spec=spec.to_dict(),
                t0_ns=time.time_ns())
    model = make_model(spec).to(device)
    ddp = nn.parallel.DistributedDataParallel(model) if world > 1 else model
    opt = torch.optim.Adam(ddp.parameters(), lr=spec.train.lr)
    per_rank = spec.train.global_batch // world
    losses, step_times = [], []
    for step in range(spec.train.steps):
        t0 = time.time_ns()
        x, y = global_batch(spec, step)
        x, y = x[rank * per_rank:(rank + 1) * per_rank].to(device), \
            y[rank * per_rank:(rank + 1) * per_rank].to(device)
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        t1 = time.time_ns()
        trace.write(type="span", cat="compute", name="step", step=step, ts_ns=t0, dur_ns=t1 - t0)
        losses.append(mean.item() / world)
        step_times.append((t1 - t0) / 1e9)
        if rank == 0:
            print(f"step {step} loss {losses[-1]:.6f} time {step_times[-1] * 1e3:.1f} ms",
                  flush=True)
    trace.close()
    if rank == 0:
        summary = {"loss": losses, "step_time_s": step_times, "world_size": world,
                   "strategy": spec.strategy, "backend": backend}
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m jobs.train")
    ap.add_argument("--spec", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    spec = parse_spec(json.loads(args.spec.read_text()), max_world_size=1 << 30)
    rank = os.environ.get("RANK", "0")
    try:
        run(spec, args.out)
    except BaseException as exc:  # noqa: BLE001 - any failure is reported, then re-raised
        (args.out / f"error-rank{rank}.txt").write_text(
            f"rank {rank}: {type(exc).__name__}: {exc}\n\n{traceback.format_exc()}")
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
