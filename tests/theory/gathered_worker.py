"""Worker for test_gathered_unit.py (under torchrun, 2 ranks, gloo): one training step of a
tiny model on FSDP2 (fully_shard per block + root, reshard_after_forward=True, as
jobs/parallel/native.NativeFSDP) metered by jobs/parallel/fsdp_meter.GatherMeter, and on the
reference engine's Zero3 (its own `gathered_peak`). FSDP2 also with 2 accumulation rounds,
gradient sync off on the first (set_requires_gradient_sync(False), as NativeFSDP.no_sync under
jobs/runners.DirectRunner). Writes OUT/rank{r}.json."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn


class Block(nn.Module):
    def __init__(self, h: int, norm: bool):
        super().__init__()
        self.fc = nn.Linear(h, h)
        self.norm = nn.LayerNorm(h) if norm else nn.Identity()

    def forward(self, x):
        return self.norm(torch.relu(self.fc(x)))


class Net(nn.Module):
    """embed (root) -> blocks -> head (root), like paralab's GPT: Linear(8,16) = 144,
    blocks 272 / 304 (+ LayerNorm 32) / 272, head Linear(16,40) = 680 parameters."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(8, 16)
        self.blocks = nn.ModuleList(Block(16, norm=i == 1) for i in range(3))
        self.head = nn.Linear(16, 40)

    def forward(self, x):
        x = self.embed(x)
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def fsdp2_step(model: nn.Module, x: torch.Tensor, steps: int = 2, rounds: int = 1) -> int:
    """The meter's peak over the last step; `rounds` micro-batches (x split along its first
    dimension) per step, gradient sync off on all but the last."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from jobs.parallel.fsdp_meter import GatherMeter
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for blk in model.blocks:
        fully_shard(blk, mesh=mesh, reshard_after_forward=True)
    fully_shard(model, mesh=mesh, reshard_after_forward=True)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    peaks = []
    for _ in range(steps):  # the second step: the optimizer state exists, buffers are reused
        meter = GatherMeter(model)
        with meter:
            for i, xi in enumerate(x.chunk(rounds)):
                model.set_requires_gradient_sync(i == rounds - 1)
                model(xi).float().square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        peaks.append(meter.peak)
    return peaks[-1]


def reference_step(model: nn.Module, x: torch.Tensor) -> int:
    from jobs.parallel.zero import Zero3
    strat = Zero3(model)
    strat.zero_grad()
    strat.backward(strat.forward(x).float().square().mean())
    return strat.gathered_peak


def main() -> None:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    res = {"fsdp2": fsdp2_step(Net(), x), "reference": reference_step(Net(), x),
           "fsdp2_accum2": fsdp2_step(Net(), x, rounds=2)}
    # paralab's GPT as the `fsdp` preset with arch gpt builds it (jobs/models/gpt.py)
    from jobs.models import model_module
    from jobs.spec import parse_spec
    spec = parse_spec(json.loads(sys.argv[2]), max_world_size=1 << 30)
    mod = model_module(spec.model.arch)
    x, _ = mod.batch(spec.model, 4, 0, 0)
    res["fsdp2_gpt"] = fsdp2_step(mod.build(spec.model, 0), x)
    res["reference_gpt"] = reference_step(mod.build(spec.model, 0), x)
    res["fsdp2_gpt_accum2"] = fsdp2_step(mod.build(spec.model, 0), x, rounds=2)
    (out / f"rank{dist.get_rank()}.json").write_text(json.dumps(res))
    # without it a rank sometimes aborted in gloo at exit ("terminate called without an active
    # exception", ~1 in 8 runs) with a peer's last collective still on its threads
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    from jobs.entry import exit_now
    exit_now(0)  # see jobs.entry.exit_now: no teardown abort after a clean run
