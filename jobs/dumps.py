"""Tensors dumped for the multi-rank tests (PARALAB_DUMP_PARAMS=1): the correctness gate
compares them with a single process (tests/support/gate.py).

Without model parallelism rank 0 writes `params-final.pt` / `grads-step0.pt` ({name: full fp32
tensor}); with it every rank writes `params-rank{R}.pt` / `grads-rank{R}.pt` ({"coords", "tp",
"params": {full-model name: local tensor, a tp shard where sharded}})."""

from __future__ import annotations

import re

import torch

from jobs.context import RunContext


def dump_params(ctx: RunContext, comp) -> None:
    _dump(ctx, comp, comp.strategy.full_parameters(), "params", "params-final.pt")


def dump_grads(ctx: RunContext, comp) -> None:
    """Gradients after step 0's reduction (call between finish_grads and step: collective)."""
    _dump(ctx, comp, comp.strategy.full_grads(), "grads", "grads-step0.pt")


def _dump(ctx, comp, full: dict, what: str, single_name: str) -> None:
    if comp.stages is None:
        if ctx.rank == 0:
            torch.save(full, ctx.out / single_name)
        return
    out = {global_name(n, comp.stages): t.detach().float().cpu() for n, t in full.items()}
    torch.save({"coords": ctx.dims.coords(ctx.rank), "tp": ctx.dims.tp, "params": out},
               ctx.out / f"{what}-rank{ctx.rank}.pt")


def global_name(name: str, stages: dict) -> str:
    """A stage parameter's name in the full model (wrappers and stage prefixes removed)."""
    chunk = 0
    if len(stages) > 1:
        head, name = name.split(".", 1)
        chunk = int(head)
    name = name.replace(".inner.", ".").replace("embed.0.", "embed.").replace("norm.0.", "norm.")
    mt = re.match(r"blocks\.(\d+)\.(.*)", name)
    if mt:
        st = stages[chunk]
        name = f"{st._layer_attr}.{st.first_layer + int(mt.group(1))}.{mt.group(2)}"
    return name
