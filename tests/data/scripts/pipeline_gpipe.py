"""Pipeline parallelism in the style of PyTorch's "Introduction to Distributed Pipeline
Parallelism" tutorial: the model cut by hand into one stage per rank, each wrapped in
`PipelineStage`, run by `ScheduleGPipe` over micro-batches; the last stage computes the loss
and reports it. Runs on CPU with gloo.

    torchrun --nproc-per-node 2 pipeline_gpipe.py --steps 3
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

import paralab

N_MICROBATCHES = 4


def stage_module(stage_index: int) -> nn.Module:
    torch.manual_seed(stage_index)
    if stage_index == 0:
        return nn.Sequential(nn.Linear(8, 16), nn.ReLU())
    return nn.Sequential(nn.Linear(16, 4))


def main(steps: int) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    module = stage_module(rank)
    stage = PipelineStage(module, rank, world, torch.device("cpu"))
    schedule = ScheduleGPipe(stage, n_microbatches=N_MICROBATCHES, loss_fn=nn.MSELoss())
    optimizer = torch.optim.SGD(module.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(0)  # every rank draws the same batches
    for step in range(steps):
        x, target = torch.randn(16, 8, generator=g), torch.randn(16, 4, generator=g)
        optimizer.zero_grad()
        if rank == 0:
            schedule.step(x)
        else:
            losses = []
            schedule.step(target=target, losses=losses)
            paralab.log(step, loss=torch.stack(losses).mean().item())
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    main(parser.parse_args().steps)
