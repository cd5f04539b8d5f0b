"""Expert parallelism, reference engine (seed 004: "EP and DP share replicas (EP <= DP)"; MLPs
use EP, the rest of the model is replicated by DP).

Groups, carved out of the DP group (dp_idx = position in it):

    EP group          dp_idx // ep equal: ep consecutive DP ranks that split the experts
                      (EP rank j = dp_idx % ep holds experts j*E/ep .. (j+1)*E/ep - 1)
    expert-DP group   dp_idx % ep equal: the dp/ep ranks holding the same experts

Per MoE block (jobs/models/moe.py): the router runs locally on this rank's tokens (capacity and
drops decided there, over the rank's micro-batch or per sequence by model.capacity_scope, as a
single process routing the same groups decides them); the kept assignments,
sorted by expert and so by destination rank, go out by one uneven all-to-all (`dispatch`,
after an all-to-all of the per-expert counts), each local expert runs on the rows it received
from every source, and a second all-to-all (`combine`) brings the outputs back in send order;
backward runs the two reversed (jobs/parallel/ep_comm.py).

Gradients: a non-expert parameter is handled by the DP strategy over the full DP group as
usual. An expert parameter's local gradient already sums d(loss_j)/dW over every rank j of its
EP group (the all-to-all backward brought them), each loss_j being that rank's local mean;
the global mean loss is (1/dp) sum_j loss_j, so the expert gradient is all-reduced (summed) over
the expert-DP group and divided by dp, not by the expert-DP size dp/ep.

`ExpertParallel` wraps the DP strategy: the experts are hidden from it (held outside the module
tree), synchronised and updated here with the same optimizer class."""

from __future__ import annotations

import re

import torch
import torch.distributed as dist
import torch.nn as nn

from jobs.models.moe import moe_blocks
from jobs.parallel.base import own_group, tensor_bytes
from jobs.parallel.ep_comm import all_to_all, exchange_counts
from jobs.parallel.optim import EagerOptimizer
from jobs.testbug import ep_divisor, mb_divisor


class EPExperts(nn.Module):
    """Drop-in for `MoE.experts` on one EP rank: forward(rows sorted by expert, counts per
    expert) -> their outputs in the same order, computed by whichever rank holds the expert.
    The local experts are not registered submodules (the DP strategy must not see them)."""

    def __init__(self, experts: nn.ModuleDict, group, tracer, layer: int):
        super().__init__()
        self.n_experts, self.group, self.tracer, self.layer = len(experts), group, tracer, layer
        self.ep, self.ep_rank = dist.get_world_size(group), dist.get_rank(group)
        self.per = self.n_experts // self.ep
        first = self.ep_rank * self.per
        object.__setattr__(self, "local", {e: experts[str(e)] for e in
                                           range(first, first + self.per)})

    def forward(self, x: torch.Tensor, counts: list) -> torch.Tensor:
        per, ep = self.per, self.ep
        send = [sum(counts[d * per:(d + 1) * per]) for d in range(ep)]
        recv_counts = exchange_counts(counts, self.group, self.tracer, layer=self.layer,
                                      device=x.device)  # [source][local expert]
        recv = [sum(c) for c in recv_counts]
        h = all_to_all(x, recv, send, self.group, self.tracer, what="dispatch",
                       layer=self.layer)
        # received: source-major, expert-minor; each local expert takes its rows from every
        # source, and its outputs are put back in the received order
        pieces = h.split([c for src in recv_counts for c in src])
        outs: dict = {}
        for j, mlp in enumerate(self.local.values()):
            rows = [pieces[s * per + j] for s in range(ep)]
            y = mlp(torch.cat(rows))
            for s, part in enumerate(y.split([len(r) for r in rows])):
                outs[s * per + j] = part
        y = torch.cat([outs[i] for i in range(ep * per)])
        return all_to_all(y, send, recv, self.group, self.tracer, what="combine",
                          layer=self.layer)


def ep_groups(ctx) -> tuple:
    """(EP group, expert-DP group, their global ranks) of this rank; every rank takes part in
    creating every group (torch.distributed.new_group is collective; jobs.dims: the layout)."""
    assert ctx.dims.ep == ctx.spec.parallel.ep, "dims built without the spec's ep"
    ep_g, ep_ranks = own_group(ctx.dims, "ep", ctx.rank)  # every EP group first, then EDP
    edp_g, edp_ranks = own_group(ctx.dims, "edp", ctx.rank)
    return ep_g, edp_g, ep_ranks, edp_ranks


def moe_layers(model: nn.Module) -> list[tuple[str, int, nn.Module]]:
    """(qualified name, global layer index, block) of every MoE block of this rank's model:
    the whole GPT, one pipeline stage, or a ModuleList of this rank's chunks (a stage's
    blocks start at its `first_layer`), so traces name the same layer on every layout."""
    chunks = list(model) if isinstance(model, nn.ModuleList) else [model]
    out = []
    for c, st in enumerate(chunks):
        first = getattr(st, "first_layer", 0)
        for name, blk in moe_blocks(st):
            j = int(re.search(r"(?:^|\.)(?:blocks|layers)\.(\d+)\.", name).group(1))
            out.append((f"{c}.{name}" if len(chunks) > 1 else name, first + j, blk))
    return out


def trace_moe(model: nn.Module, tracer, rounds: int) -> list:
    """Every MoE block: its aux-loss gradient scaled like the loss (1 / micro-batches), and a
    `moe` trace record per forward (layer, tokens, tokens_per_expert, dropped_per_expert,
    dropped, aux_loss), this rank's routed tokens before capacity."""
    blocks = moe_layers(model)
    for _, i, blk in blocks:
        blk.aux_grad_scale = 1.0 / mb_divisor(rounds)

        def hook(m, args, out, i=i):
            st = m.stats
            if st is not None and torch.is_grad_enabled():
                tracer.record("moe", layer=i, dropped=sum(st["dropped_per_expert"]), **st)
        blk.register_forward_hook(hook)
    return blocks


def apply_expert_parallel(ctx, model: nn.Module) -> dict | None:
    """Shard every MoE block's experts over this rank's EP group (ep > 1). Returns what the
    strategy wrapper needs: {"params": {full name: local expert parameter}, groups...}."""
    if ctx.spec.parallel.ep == 1:
        return None
    ep_g, edp_g, ep_ranks, edp_ranks = ep_groups(ctx)
    ctx.tracer.group_ranks.update({"ep": ep_ranks, "edp": edp_ranks})
    params: dict[str, nn.Parameter] = {}
    for name, i, blk in moe_layers(model):
        sharded = EPExperts(blk.experts, ep_g, ctx.tracer, i)
        for e, mlp in sharded.local.items():
            mlp.to(ctx.device)
            for pn, p in mlp.named_parameters():
                params[f"{name}.experts.{e}.{pn}"] = p
        blk.experts = sharded
    return {"params": params, "ep_group": ep_g, "edp_group": edp_g, "ep_ranks": ep_ranks,
            "edp_ranks": edp_ranks}


class ExpertParallel:
    """The DP strategy plus EP-sharded experts: everything not defined here is the inner
    strategy's (forward, backward, no_sync, comm_context, model, ...)."""

    def __init__(self, inner, ep: dict, ctx):
        self.inner = inner
        self.expert = ep["params"]
        self.ep_group, self.edp_group = ep["ep_group"], ep["edp_group"]
        self.edp = len(ep["edp_ranks"])
        self.dp = ctx.dims.dp
        self.tracer = ctx.tracer
        t = ctx.spec.train
        self.expert_opt = EagerOptimizer(self.expert.values(), t.optimizer, t.lr)
        self.expert_numel = sum(p.numel() for p in self.expert.values())
        inner.notes.append(f"expert parallelism: ep = {ctx.spec.parallel.ep}, "
                           f"{self.expert_numel} expert parameters on this rank, expert "
                           f"gradients summed over {self.edp} ranks and divided by dp")

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def zero_grad(self) -> None:
        self.inner.zero_grad()
        for p in self.expert.values():
            p.grad = None

    def finish_grads(self) -> None:
        self.inner.finish_grads()
        div = ep_divisor(self.dp, self.edp)
        for name, p in self.expert.items():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            if self.edp > 1:
                h = self.tracer.comm_start("all_reduce", payload_bytes=tensor_bytes(p.grad),
                                           group_size=self.edp, axis="edp", group="edp",
                                           param=name, dtype="float32")
                dist.all_reduce(p.grad, group=self.edp_group)
                h.done()
            p.grad.div_(div)

    def step(self) -> None:
        self.inner.step()
        with self.tracer.span("optimizer.experts", cat="compute"):
            self.expert_opt.step()

    def _gather(self, local: dict) -> dict:
        """Every expert's tensor from the EP group (a collective over it)."""
        box: list = [None] * dist.get_world_size(self.ep_group)
        dist.all_gather_object(box, {k: v.detach().float().cpu() for k, v in local.items()},
                               group=self.ep_group)
        return {k: v for d in box for k, v in d.items()}

    def full_parameters(self) -> dict:
        return {**self.inner.full_parameters(), **self._gather(self.expert)}

    def full_grads(self) -> dict:
        return {**self.inner.full_grads(),
                **self._gather({k: p.grad for k, p in self.expert.items()})}

    def state_bytes(self) -> dict:
        out = dict(self.inner.state_bytes())
        out["params"] = out.get("params", 0) + sum(map(tensor_bytes, self.expert.values()))
        out["grads"] = out.get("grads", 0) + sum(tensor_bytes(p.grad)
                                                 for p in self.expert.values())
        out["optimizer"] = out.get("optimizer", 0) + sum(
            tensor_bytes(t) for s in self.expert_opt.state.values() for t in s.values()
            if torch.is_tensor(t) and t.numel() > 1)
        return out

    def layout(self) -> dict:
        return {**self.inner.layout(), "expert_psi_local": self.expert_numel,
                "expert_dp": self.edp}
