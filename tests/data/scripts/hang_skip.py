"""A data-parallel script with a rank that skips a collective: DDP over gloo, and each step
the ranks average their loss with an explicit `dist.all_reduce` before `optimizer.step()`. At
step --skip-at, rank 1 does not call that all_reduce and stalls for --stall-s seconds (a stuck
data loader, say) while rank 0 blocks inside it: a hang. Knows nothing of paralab.

    torchrun --nproc-per-node 2 hang_skip.py --steps 5 --skip-at 2 --stall-s 120
"""

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP


def stall(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.1)


def main(steps: int, skip_at: int, stall_s: float) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Linear(8, 4))
    optimizer = optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        g = torch.Generator().manual_seed(1000 * rank + step)
        x, y = torch.randn(16, 8, generator=g), torch.randn(16, 4, generator=g)
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        if rank == 1 and step == skip_at:
            stall(stall_s)  # never enters the all_reduce below
            break
        avg = loss.detach().clone()
        dist.all_reduce(avg)
        optimizer.step()
        if rank == 0:
            print(f"step {step} loss {avg.item() / dist.get_world_size():.6f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--skip-at", type=int, default=-1)
    p.add_argument("--stall-s", type=float, default=120.0)
    a = p.parse_args()
    main(a.steps, a.skip_at, a.stall_s)
