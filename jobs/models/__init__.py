"""Plain models. Each `jobs/models/<arch>.py` exposes the same three functions:

    build(model_spec, seed) -> nn.Module     parameters depend only on seed and model settings
    loss_fn(out, target) -> scalar tensor    the mean over the samples given
    batch(model_spec, global_batch, seed, step) -> (inputs, targets)   one global batch

so a training loop picks them by `spec.model.arch` and never branches on the model.
"""

from __future__ import annotations

from types import ModuleType

import torch.nn as nn

from jobs.models import gpt, mlp, timed

MODELS: dict[str, ModuleType] = {"mlp": mlp, "gpt": gpt, "timed": timed}  # spec.ARCHS


def model_module(arch: str) -> ModuleType:
    return MODELS[arch]


def layer_list(model):
    """The model's repeated layers (`blocks` or `layers` ModuleList), the units ZeRO-3/FSDP shard
    one at a time; None when the model has none."""
    for name in ("blocks", "layers"):
        mods = getattr(model, name, None)
        if isinstance(mods, nn.ModuleList):
            return mods
    return None
