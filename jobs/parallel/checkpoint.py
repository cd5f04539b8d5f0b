"""Activation checkpointing: each repeated layer keeps only its input for backward and
recomputes its activations there (torch.utils.checkpoint, non-reentrant).

Applied by jobs/compose.py after the pipeline split and tensor parallelism and before the DP /
ZeRO / FSDP strategy (the order of Megatron and torchtitan), to the layers of this rank's model
or stages. With tensor parallelism the recomputed forward repeats its collectives (Megatron's
f / g all-reduces; DTensor's funcols): they run during backward and are traced there
(`phase: "bwd"`, `recompute: true` on the reference engine); jobs/theory predicts them."""

from __future__ import annotations

import contextlib

from torch.utils.checkpoint import checkpoint

from jobs.models import layer_list

_RECOMPUTING = [0]


def recomputing() -> bool:
    """True while a checkpointed layer re-runs its forward inside backward."""
    return _RECOMPUTING[0] > 0


class _Mark:
    """Re-enterable (a split backward, B then W, recomputes a layer twice)."""

    def __enter__(self):
        _RECOMPUTING[0] += 1

    def __exit__(self, *exc):
        _RECOMPUTING[0] -= 1


def _recompute_context():
    return contextlib.nullcontext(), _Mark()


def apply_activation_checkpointing(module) -> int:
    """Checkpoint every repeated layer of `module` (a model or a pipeline stage); returns how
    many layers were wrapped."""
    layers = layer_list(module) or []
    for blk in layers:
        fwd = blk.forward
        blk.forward = lambda *a, _f=fwd: checkpoint(
            _f, *a, use_reentrant=False, context_fn=_recompute_context)
    return len(layers)
