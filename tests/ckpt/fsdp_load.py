"""Test helper, under torchrun: load a paralab checkpoint into another layout with torch's API
only, the resharding snippet of docs/checkpoints.md: the plain model wrapped in FSDP2
(`fully_shard`, every parameter a DTensor shard over all ranks) + torch.optim.Adam, then
get_state_dict / dcp.load / set_state_dict. Writes RESULT.json (rank 0): {losses: [the loss at
the checkpoint's step, the loss at the next step after one Adam step]}. Usage:

    torchrun --nproc-per-node N -m tests.ckpt.fsdp_load --ckpt STEP_DIR --spec S --out R
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from jobs.data import global_batch
from jobs.models import model_module
from jobs.spec import parse_spec


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--spec", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    spec = parse_spec(json.loads(args.spec.read_text()), max_world_size=1 << 30)
    step = int(json.loads((Path(args.ckpt) / "COMMITTED").read_text())["step"])
    mod = model_module(spec.model.arch)
    r, n = dist.get_rank(), dist.get_world_size()

    model = mod.build(spec.model, spec.train.seed + 1)  # other initial values than the run's
    mesh = init_device_mesh("cpu", (n,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=spec.train.lr)
    msd, osd = get_state_dict(model, opt)
    dcp.load({"model": msd, "optim": osd}, checkpoint_id=args.ckpt)
    set_state_dict(model, opt, model_state_dict=msd, optim_state_dict=osd)

    def local_loss(s):  # this rank's equal slice of the global batch: the mean of means
        x, y = global_batch(spec, s)
        per = x.shape[0] // n
        return mod.loss_fn(model(x[r * per:(r + 1) * per]), y[r * per:(r + 1) * per])

    first = local_loss(step)
    first.backward()
    opt.step()
    with torch.no_grad():
        second = local_loss(step + 1)
    losses = torch.stack([first.detach(), second])
    dist.all_reduce(losses)
    if r == 0:
        args.out.write_text(json.dumps({"losses": (losses / n).tolist()}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
