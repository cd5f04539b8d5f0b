"""FSDP2 training in the style of PyTorch's "Getting Started with Fully Sharded Data Parallel
(FSDP2)" tutorial: every layer and then the root module sharded with `fully_shard` over a 1-D
device mesh, Adam, a few steps on random data. Runs on CPU with gloo.

    torchrun --nproc-per-node 2 fsdp2_mlp.py --steps 4
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import paralab


def main(steps: int) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                          nn.Linear(32, 4))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    torch.manual_seed(1 + rank)
    for step in range(steps):
        x, y = torch.randn(8, 16), torch.randn(8, 4)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optim.step()
        optim.zero_grad()
        paralab.log(step, loss=loss.item())
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    main(parser.parse_args().steps)
