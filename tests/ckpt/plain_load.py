"""Test helper, run in a fresh process (no process group): load a paralab checkpoint into the
plain single-process model with torch's own API only, the way a user would, and report what
tests/ckpt/test_dcp_standard.py checks. Usage:

    python -m tests.ckpt.plain_load --ckpt STEP_DIR --spec SPEC.json --out RESULT.json

The model is built by jobs.models (the plain nn.Module) and the batches come from jobs.data (a
function of the step); everything that reads the checkpoint is torch's: `dcp.load` for the
weights alone, then `get_state_dict` / `dcp.load` / `set_state_dict` for model + optimizer.
RESULT.json: {step, loss_model_only (the loss at the checkpoint's step after loading the model
alone), losses (the losses at that step and the next, one torch.optim.Adam step in between,
from the optimizer state loaded), keys (the checkpoint's keys, DCP-flattened), torch_keys
(what torch saves for the plain model + Adam, the same way), shapes ({key: [size, dtype]} of
the tensors of both), param_groups_equal}."""

from __future__ import annotations

import argparse
import copy
import json
import tempfile
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from jobs.data import global_batch
from jobs.models import model_module
from jobs.spec import parse_spec


def _tensors(meta) -> dict:
    return {k: [list(v.size), str(v.properties.dtype)] for k, v in
            meta.state_dict_metadata.items() if isinstance(v, TensorStorageMetadata)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--spec", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    spec = parse_spec(json.loads(args.spec.read_text()), max_world_size=1 << 30)
    step = int(json.loads((Path(args.ckpt) / "COMMITTED").read_text())["step"])
    mod = model_module(spec.model.arch)

    def loss(model, s):
        x, y = global_batch(spec, s)
        return mod.loss_fn(model(x), y)

    # 1. the weights alone, into model.state_dict(): the one-liner of docs/checkpoints.md
    model = mod.build(spec.model, spec.train.seed + 1)  # other initial values than the run's
    sd = model.state_dict()
    dcp.load({"model": sd}, checkpoint_id=args.ckpt)
    model.load_state_dict(sd)
    with torch.no_grad():
        loss_model_only = float(loss(model, step))

    # 2. model + optimizer with torch's get_state_dict / set_state_dict pattern
    model = mod.build(spec.model, spec.train.seed + 1)
    opt = torch.optim.Adam(model.parameters(), lr=spec.train.lr)
    msd, osd = get_state_dict(model, opt)
    fresh_groups = copy.deepcopy(osd["param_groups"])
    with tempfile.TemporaryDirectory() as d:  # what torch itself saves for this model
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=d)
        torch_meta = dcp.FileSystemReader(d).read_metadata()
    dcp.load({"model": msd, "optim": osd}, checkpoint_id=args.ckpt)
    groups_equal = osd["param_groups"] == fresh_groups
    set_state_dict(model, opt, model_state_dict=msd, optim_state_dict=osd)
    first = loss(model, step)
    first.backward()
    opt.step()
    with torch.no_grad():
        second = loss(model, step + 1)

    meta = dcp.FileSystemReader(args.ckpt).read_metadata()
    args.out.write_text(json.dumps({
        "step": step, "loss_model_only": loss_model_only,
        "losses": [float(first), float(second)],
        "keys": sorted(meta.state_dict_metadata), "torch_keys": sorted(
            torch_meta.state_dict_metadata),
        "shapes": _tensors(meta), "torch_shapes": _tensors(torch_meta),
        "param_groups_equal": groups_equal}))


if __name__ == "__main__":
    main()
