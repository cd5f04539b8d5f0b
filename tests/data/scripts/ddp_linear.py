"""Distributed data parallel training of a small model, in the style of PyTorch's "Getting
Started with Distributed Data Parallel" tutorial: one process per rank (torchrun), gloo, the
model wrapped in DistributedDataParallel, plain SGD. Each rank trains on its own random batch
and reports its loss with paralab.log (a no-op outside paralab).

    torchrun --nproc-per-node 2 ddp_linear.py --steps 5 [--fail-at STEP]
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP

import paralab


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def batch(rank: int, step: int):
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(20, 10, generator=g), torch.randn(20, 5, generator=g)


def demo_basic(steps: int, fail_at: int) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)  # the same initial weights on every rank
    model = ToyModel()
    ddp_model = DDP(model)
    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.1)
    for step in range(steps):
        inputs, labels = batch(rank, step)
        optimizer.zero_grad()
        outputs = ddp_model(inputs)
        loss = loss_fn(outputs, labels)
        loss.backward()
        optimizer.step()
        paralab.log(step, loss=loss.item())
        if rank == 0:
            print(f"step {step} loss {loss.item():.6f}")
        if step == fail_at:
            raise RuntimeError(f"deliberate failure after step {step}")
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--fail-at", type=int, default=-1)
    args = parser.parse_args()
    demo_basic(args.steps, args.fail_at)
