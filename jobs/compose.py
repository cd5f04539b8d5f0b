"""One composition: a spec's parallelisms applied to a plain model in one fixed order

    1. pipeline split          this rank's stages (pp > 1), or the whole model as one stage
                               when only tp > 1; nothing with neither
    2. TP / SP / vocabulary    Megatron layers (reference) or DTensor plans (native), per stage
    2b. EP                     mixture of experts: every MoE block's aux-loss scale and trace
                               hook; ep > 1: experts sharded over the EP group, tokens moved by
                               all-to-all (jobs/parallel/expert.py), hidden from step 4
    2c. CP                     cp > 1: ring attention and chunk positions on the CP group
                               carved out of dp (jobs/parallel/context.py), before TP shards
                               the attention's linears
    3. activation checkpointing  every repeated layer recomputed in backward
                               (jobs/parallel/checkpoint.py)
    4. DP / ZeRO / FSDP        the strategy over mesh["dp"], from the tables below (ep > 1:
                               wrapped by ExpertParallel, expert gradients over expert-DP)

The engine (spec.parallel.engine) is looked up here, once. `compose` returns `Composed`: the
strategy, the runner that puts a step's micro-batches through the model (jobs/runners.py: one
after the other, or through a pipeline schedule) and the context around a step's compute, which
is all the one training loop (jobs/loop.py) needs. docs/strategies.md shows the order."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch.distributed as dist
import torch.nn as nn

from jobs import schedules
from jobs.context import RunContext
from jobs.data import local_microbatches
from jobs.models import layer_list, model_module
from jobs.parallel.checkpoint import apply_activation_checkpointing
from jobs.parallel.context import apply_context_parallel
from jobs.parallel.data import DDP, AllReduceDP, ParameterServerDP, Single
from jobs.parallel.expert import ExpertParallel, apply_expert_parallel, trace_moe
from jobs.parallel.native import NativeDDP, NativeFSDP
from jobs.parallel.pipeline.runtime import PipelineRuntime
from jobs.parallel.pipeline.stage import (
    Stage,
    measure_layer_costs,
    partition_by_cost,
    partition_even,
    split_stages,
)
from jobs.parallel.tensor import apply_native_tensor_parallel, apply_tensor_parallel
from jobs.parallel.threed import NativeMP
from jobs.parallel.vocab_parallel import (
    apply_native_vocab_parallel,
    apply_vocab_parallel,
    native_vocab_parallel_loss,
    vocab_parallel_loss,
)
from jobs.parallel.zero import Zero3, Zero12
from jobs.runners import DirectRunner, PipelineRunner
from jobs.strategies import of_parallel
from jobs.testbug import mb_divisor


def _group(ctx):
    return ctx.mesh["dp"].get_group()


def _native_allreduce(m, ctx, kw):
    s = AllReduceDP(m, _group(ctx), ctx.tracer, **kw)  # torch.distributed.all_reduce itself
    s.engine = "native"
    return s


def _no_native_ps(m, ctx, kw):
    raise NotImplementedError("the parameter server has no native PyTorch component; use "
                              "engine 'reference'")


# DP family (dp_mode, or zero{stage}; "single" when dp = 1) -> strategy, per engine
REFERENCE_DP = {
    "single": lambda m, ctx, kw: Single(m, None, ctx.tracer, **kw),
    "ps": lambda m, ctx, kw: ParameterServerDP(m, _group(ctx), ctx.tracer, **kw),
    "allreduce": lambda m, ctx, kw: AllReduceDP(m, _group(ctx), ctx.tracer, **kw),
    "ddp": lambda m, ctx, kw: DDP(m, _group(ctx), ctx.tracer, **kw),
    "zero1": lambda m, ctx, kw: Zero12(m, _group(ctx), ctx.tracer, stage=1, **kw),
    "zero2": lambda m, ctx, kw: Zero12(m, _group(ctx), ctx.tracer, stage=2, **kw),
    "zero3": lambda m, ctx, kw: Zero3(m, _group(ctx), ctx.tracer, **kw),
}
NATIVE_DP = {
    "single": REFERENCE_DP["single"],
    "ps": _no_native_ps,
    "allreduce": _native_allreduce,
    "ddp": lambda m, ctx, kw: NativeDDP(m, _group(ctx), ctx.tracer, **kw),
    "zero1": lambda m, ctx, kw: NativeDDP(m, _group(ctx), ctx.tracer, zero=True, **kw),
    "zero2": lambda m, ctx, kw: NativeFSDP(m, ctx.mesh["dp"], ctx.tracer, reshard=False, **kw),
    "zero3": lambda m, ctx, kw: NativeFSDP(m, ctx.mesh["dp"], ctx.tracer, reshard=True, **kw),
}
DP_TABLES = {"reference": REFERENCE_DP, "native": NATIVE_DP}


def dp_family(ctx: RunContext) -> str:
    return of_parallel(ctx.spec.parallel, ctx.dims.dp).family


def strategy_kwargs(ctx: RunContext) -> dict:
    p, t = ctx.spec.parallel, ctx.spec.train
    return {"lr": t.lr, "precision": t.precision, "fp32_grads": t.fp32_grads,
            "bucket_mb": p.bucket_mb, "optimizer": t.optimizer}


def build_strategy(ctx: RunContext, model: nn.Module):
    """Step 4 alone: the DP / ZeRO / FSDP strategy for `ctx.spec` over a (sharded) model."""
    return DP_TABLES[ctx.spec.parallel.engine][dp_family(ctx)](model, ctx, strategy_kwargs(ctx))


@dataclass
class Composed:
    strategy: object
    runner: object
    stages: dict | None = None  # chunk -> Stage (model parallelism), else None
    schedule: str | None = None  # pipeline schedule (model parallelism)
    notes: list = field(default_factory=list)
    vocab_native: bool = False

    @property
    def model_parallel(self) -> bool:
        return self.stages is not None

    def loss_context(self):
        """Native vocab parallelism: cross-entropy on vocab-sharded DTensor logits needs
        `loss_parallel()` around forward and backward."""
        if self.vocab_native:
            from torch.distributed.tensor.parallel import loss_parallel
            return loss_parallel()
        return contextlib.nullcontext()


def compose(ctx: RunContext) -> Composed:
    spec, dims = ctx.spec, ctx.dims
    p, t = spec.parallel, spec.train
    mod = model_module(spec.model.arch)
    rounds = t.grad_accum * p.microbatches
    if dims.tp == 1 and dims.pp == 1:
        model = mod.build(spec.model, t.seed).to(ctx.device)
        apply_context_parallel(ctx, model)                                 # 2c
        trace_moe(model, ctx.tracer, rounds)                               # 2b
        ep = apply_expert_parallel(ctx, model)
        if t.activation_checkpointing:                                     # 3
            apply_activation_checkpointing(model)
        strategy = build_strategy(ctx, model)                              # 4
        if ep is not None:
            strategy = ExpertParallel(strategy, ep, ctx)
        return Composed(strategy, DirectRunner(strategy, mod.loss_fn, ctx.tracer, rounds))
    stages = split(ctx, mod)                                               # 1
    apply_context_parallel(ctx, *stages.values())                          # 2c
    loss_fn = shard(ctx, stages, mod.loss_fn)                              # 2
    if t.activation_checkpointing:                                         # 3
        for st in stages.values():
            apply_activation_checkpointing(st)
    for st in stages.values():
        st.to(ctx.device)
    model = stages[0] if len(stages) == 1 else nn.ModuleList(stages.values())
    trace_moe(model, ctx.tracer, rounds)                                   # 2b
    ep = apply_expert_parallel(ctx, model)
    if p.engine == "native":                                               # 4
        strategy = NativeMP(model, stages, ctx, **strategy_kwargs(ctx))
    else:
        strategy = build_strategy(ctx, model)
    if ep is not None:
        strategy = ExpertParallel(strategy, ep, ctx)
    schedule = p.pp_schedule if dims.pp > 1 else "1f1b"
    runner = PipelineRunner(pipeline(ctx, stages, loss_fn, schedule), strategy, ctx,
                            t.grad_accum, p.microbatches)
    return Composed(strategy, runner, stages, schedule,
                    vocab_native=p.engine == "native" and p.vocab_parallel)


def split(ctx: RunContext, mod) -> dict[int, nn.Module]:
    """Step 1: this rank's model stages {chunk: Stage} (pp = 1: the whole model, one stage)."""
    spec, dims = ctx.spec, ctx.dims
    p = spec.parallel
    full = mod.build(spec.model, spec.train.seed)
    if dims.pp > 1:
        if p.pp_partition == "measured":
            sizes = measured_partition(ctx, full, mod)
        else:
            sizes = partition_even(spec.model.layers, dims.pp * p.virtual_stages)
            ctx.partition = {"mode": "even", "layers_per_stage": sizes}
        stages = split_stages(full, dims.pp, p.virtual_stages, dims.coords(ctx.rank)["pp"],
                              sizes=sizes, placement=schedules.placement_of(p.pp_schedule))
    else:
        stages = {0: Stage(getattr(full, "embed", None), list(layer_list(full)),
                           getattr(full, "head", None), index=0, first_layer=0)}
        ctx.partition = {"mode": "even", "layers_per_stage": [spec.model.layers]}
    attr = "layers" if isinstance(getattr(full, "layers", None), nn.ModuleList) else "blocks"
    for st in stages.values():
        st._layer_attr = attr
    return stages


def shard(ctx: RunContext, stages: dict, loss_fn):
    """Step 2: tensor (+ sequence, + vocabulary) parallelism on every stage; returns the loss
    function to use (vocabulary parallelism computes it on vocab-sharded logits)."""
    p = ctx.spec.parallel
    if ctx.dims.tp == 1:
        return loss_fn
    if p.engine == "native":
        mesh = ctx.mesh["tp"]
        for st in stages.values():
            apply_native_tensor_parallel(st, mesh, sequence_parallel=p.sequence_parallel,
                                         vocab_parallel=p.vocab_parallel)
        if p.vocab_parallel and any([apply_native_vocab_parallel(
                st, mesh, sequence_parallel=p.sequence_parallel) for st in stages.values()]):
            return native_vocab_parallel_loss(loss_fn)
        return loss_fn
    group = ctx.mesh["tp"].get_group()
    for st in stages.values():
        apply_tensor_parallel(st, group, tracer=ctx.tracer, sequence_parallel=p.sequence_parallel)
    if p.vocab_parallel:
        starts = [apply_vocab_parallel(st, group, tracer=ctx.tracer,
                                       sequence_parallel=p.sequence_parallel)
                  for st in stages.values()]
        starts = [s for s in starts if s is not None]
        if starts:
            return vocab_parallel_loss(group, ctx.tracer, starts[0])
    return loss_fn


def pipeline(ctx: RunContext, stages: dict, loss_fn, schedule: str):
    """The pipeline runtime over this rank's stages (pp = 1: a one-stage pipeline, F and BW
    per micro-batch); the engine picks torch.distributed.pipelining or the reference runtime."""
    spec, dims, p = ctx.spec, ctx.dims, ctx.spec.parallel
    m, accum = p.microbatches, spec.train.grad_accum
    c = dims.coords(ctx.rank)
    if p.engine == "native" and dims.pp > 1:
        # imported here: torch.distributed.pipelining imports torch._dynamo (with DTensor and
        # sympy ~1 CPU-s per rank), which no other layout needs (jobs/parallel/optim.py)
        from jobs.parallel.pipeline.native import NativePipeline

        rt = NativePipeline(stages, schedule=schedule, p=dims.pp, m=m, v=p.virtual_stages,
                            rank=c["pp"], pp_group=ctx.mesh["pp"].get_group(),
                            loss_fn=loss_fn, tracer=ctx.tracer, device=ctx.device)
        # the torch schedule divides by m itself; the test-only bug cancels that too
        rt.loss_scale = m / mb_divisor(m * accum)
        return rt
    replicas = dims.dp // getattr(p, "cp", 1)  # CP ranks of a DP group share samples
    mb = spec.train.global_batch // replicas // (m * accum)
    rt = PipelineRuntime(stages, schedule=schedule, p=dims.pp, m=m, v=p.virtual_stages,
                         rank=c["pp"], pp_ranks=dims.group_ranks("pp", ctx.rank),
                         loss_fn=loss_fn, act_shape=act_shape(spec, dims, mb),
                         tracer=ctx.tracer, device=ctx.device)
    rt.loss_scale = 1.0 / mb_divisor(m * accum)
    return rt


def measured_partition(ctx: RunContext, full, mod) -> list[int]:
    """Layers per global stage from per-layer costs timed on rank 0 (one micro-batch of this
    run's size) and broadcast, so every rank cuts the model at the same places."""
    spec, dims = ctx.spec, ctx.dims
    box = [None]
    if ctx.rank == 0:
        rounds = spec.parallel.microbatches * spec.train.grad_accum
        x, y = local_microbatches(spec, 0, 0, dims.dp, rounds)[0]
        with ctx.tracer.span("partition", cat="compute"):
            box[0] = measure_layer_costs(full, x, y, mod.loss_fn)
    dist.broadcast_object_list(box, src=0)
    costs = box[0]
    sizes = partition_by_cost(costs, dims.pp * spec.parallel.virtual_stages)
    ctx.partition = {"mode": "measured", "layer_costs_s": costs, "layers_per_stage": sizes}
    return sizes


def act_shape(spec, dims, mb: int) -> tuple:
    m = spec.model
    if m.arch != "gpt":
        return (mb, m.hidden)
    s = m.seq_len // dims.tp if spec.parallel.sequence_parallel else m.seq_len
    s //= getattr(spec.parallel, "cp", 1)  # context parallelism: this rank's chunks
    return (mb, s, m.hidden)
