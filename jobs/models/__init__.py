"""Plain models. Each `jobs/models/<arch>.py` exposes the same three functions:

    build(model_spec, seed) -> nn.Module     parameters depend only on seed and model settings
    loss_fn(out, target) -> scalar tensor    the mean over the samples given
    batch(model_spec, global_batch, seed, step) -> (inputs, targets)   one global batch

so a training loop picks them by `spec.model.arch` and never branches on the model.
"""

from __future__ import annotations

import importlib
from types import ModuleType


def model_module(arch: str) -> ModuleType:
    return importlib.import_module(f"jobs.models.{arch}")


def layer_list(model):
    """The model's repeated layers (`blocks` or `layers` ModuleList), the units ZeRO-3/FSDP shard
    one at a time; None when the model has none."""
    import torch.nn as nn
    for name in ("blocks", "layers"):
        mods = getattr(model, name, None)
        if isinstance(mods, nn.ModuleList):
            return mods
    return None
