"""Model parallelism and 3D composition: the loop `jobs/train.py` hands over to when tp > 1 or
pp > 1 (docs/model-parallel.md).

Order (ARCHITECTURE.md): plain model -> pipeline split (this rank's stages) -> tensor (+ sequence)
parallelism per stage -> the DP / ZeRO strategy of `jobs.train.build_strategy` over the dp axis
of the mesh. Each step runs `grad_accum` pipeline rounds of `microbatches` micro-batches through
`PipelineRuntime` (with pp = 1 a one-stage "pipeline": F, BW per micro-batch), then sums the
partial gradients of sequence-parallel parameters over tp, then lets the DP strategy reduce and
step. Communication is tagged by axis: tp (tp_comm), pp (pipeline/p2p), dp (the strategy).

Rank 0 writes the summary: the DP loop's fields plus `pipeline` (per-stage measured bubble from
the trace next to the simulator's, per-stage activation memory) and per-rank `bytes_by_axis`.
"""

from __future__ import annotations

import contextlib
import os
import re

import torch
import torch.distributed as dist
import torch.nn as nn

from jobs import bubbles, schedules
from jobs.data import local_microbatches
from jobs.memory import MemoryBook, process_memory
from jobs.models import model_module
from jobs.parallel.pipeline.runtime import PipelineRuntime
from jobs.parallel.pipeline.stage import (
    Stage,
    measure_layer_costs,
    partition_by_cost,
    partition_even,
    split_stages,
)
from jobs.parallel.tensor import allreduce_sequence_parallel_grads, apply_tensor_parallel
from jobs.testbug import mb_divisor


def build_stages(ctx) -> tuple[dict[int, nn.Module], object]:
    """This rank's model stages {chunk: module}, sharded over tp, and the loss function."""
    spec, dims = ctx.spec, ctx.dims
    p = spec.parallel
    mod = model_module(spec.model.arch)
    full = mod.build(spec.model, spec.train.seed)
    c = dims.coords(ctx.rank)
    loss_fn = mod.loss_fn
    if dims.pp > 1:
        if p.pp_partition == "measured":
            sizes = measured_partition(ctx, full, mod)
        else:
            sizes = partition_even(spec.model.layers, dims.pp * p.virtual_stages)
            ctx.partition = {"mode": "even", "layers_per_stage": sizes}
        stages = split_stages(full, dims.pp, p.virtual_stages, c["pp"], sizes=sizes,
                              placement=schedules.placement_of(p.pp_schedule))
    else:
        stages = {0: Stage(getattr(full, "embed", None), list(_layers(full)),
                           getattr(full, "head", None), index=0, first_layer=0)}
        ctx.partition = {"mode": "even", "layers_per_stage": [spec.model.layers]}
    if dims.tp > 1:
        if p.engine == "native":
            from jobs.parallel.tensor import apply_native_tensor_parallel
            for st in stages.values():
                apply_native_tensor_parallel(st, ctx.mesh["tp"],
                                             sequence_parallel=p.sequence_parallel,
                                             vocab_parallel=p.vocab_parallel)
            if p.vocab_parallel:
                from jobs.parallel.vocab_parallel import (
                    apply_native_vocab_parallel,
                    native_vocab_parallel_loss,
                )
                heads = [apply_native_vocab_parallel(st, ctx.mesh["tp"],
                                                     sequence_parallel=p.sequence_parallel)
                         for st in stages.values()]
                if any(heads):
                    loss_fn = native_vocab_parallel_loss(loss_fn)
        else:
            group = ctx.mesh["tp"].get_group()
            for st in stages.values():
                apply_tensor_parallel(st, group, tracer=ctx.tracer,
                                      sequence_parallel=p.sequence_parallel)
            if p.vocab_parallel:
                from jobs.parallel.vocab_parallel import apply_vocab_parallel, vocab_parallel_loss
                starts = [apply_vocab_parallel(st, group, tracer=ctx.tracer,
                                               sequence_parallel=p.sequence_parallel)
                          for st in stages.values()]
                starts = [s for s in starts if s is not None]
                if starts:
                    loss_fn = vocab_parallel_loss(group, ctx.tracer, starts[0])
    attr = "layers" if isinstance(getattr(full, "layers", None), nn.ModuleList) else "blocks"
    for st in stages.values():
        st._layer_attr = attr
        st.to(ctx.device)
    return stages, loss_fn


def measured_partition(ctx, full, mod) -> list[int]:
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


def _layers(model):
    from jobs.models import layer_list
    return layer_list(model)


def act_shape(spec, dims, mb: int) -> tuple:
    m = spec.model
    if m.arch != "gpt":
        return (mb, m.hidden)
    s = m.seq_len // dims.tp if spec.parallel.sequence_parallel else m.seq_len
    return (mb, s, m.hidden)


def make_strategy(ctx, stages):
    """The DP-axis strategy over this rank's stages (jobs/train.py's dispatch)."""
    model = stages[0] if len(stages) == 1 else nn.ModuleList(stages.values())
    if ctx.spec.parallel.engine == "native":
        from jobs.parallel.threed import NativeMP
        return NativeMP(model, stages, ctx, lr=ctx.spec.train.lr,
                        optimizer=ctx.spec.train.optimizer)
    from jobs.train import build_strategy
    return build_strategy(ctx, model)


def run(ctx) -> dict:
    spec, dims, tr = ctx.spec, ctx.dims, ctx.tracer
    p = spec.parallel
    c = dims.coords(ctx.rank)
    stages, loss_fn = build_stages(ctx)
    strategy = make_strategy(ctx, stages)
    m, accum = p.microbatches, spec.train.grad_accum
    mb = spec.train.global_batch // dims.dp // (m * accum)
    schedule = p.pp_schedule if dims.pp > 1 else "1f1b"
    if p.engine == "native" and dims.pp > 1:
        from jobs.parallel.pipeline.native import NativePipeline
        rt = NativePipeline(stages, schedule=schedule, p=dims.pp, m=m, v=p.virtual_stages,
                            rank=c["pp"], pp_group=ctx.mesh["pp"].get_group(),
                            loss_fn=loss_fn, tracer=tr, device=ctx.device)
        # the torch schedule divides by m itself; the test-only bug cancels that too
        rt.loss_scale = m / mb_divisor(m * accum)
    else:
        rt = PipelineRuntime(stages, schedule=schedule, p=dims.pp, m=m, v=p.virtual_stages,
                             rank=c["pp"], pp_ranks=dims.group_ranks("pp", ctx.rank),
                             loss_fn=loss_fn, act_shape=act_shape(spec, dims, mb),
                             tracer=tr, device=ctx.device)
        rt.loss_scale = 1.0 / mb_divisor(m * accum)
    tp_group = ctx.mesh["tp"].get_group() if dims.tp > 1 else None
    book = MemoryBook()
    losses, step_times = [], []
    for step in range(spec.train.steps):
        tr.step = step
        t0 = tr.now()
        mbs = local_microbatches(spec, step, c["dp"], dims.dp, m * accum, ctx.device)
        strategy.zero_grad()
        total = None
        with tr.span("step", cat="step"), strategy.comm_context(), _loss_context(p):
            with strategy.no_sync():
                for a in range(accum):
                    loss = rt.step(mbs[a * m:(a + 1) * m])
                    total = loss if total is None else total + loss
            if tp_group is not None and p.sequence_parallel and p.engine != "native":
                allreduce_sequence_parallel_grads(strategy.model, tp_group, tr)
            with tr.span("grad_sync", cat="comm"):
                strategy.finish_grads()
            if step == 0 and os.environ.get("PARALAB_DUMP_PARAMS") == "1":
                dump_tensors(ctx, strategy.full_grads(), stages, "grads")
            strategy.step()
        sample = {**strategy.state_bytes(), "activations": rt.peak["activation_bytes"]}
        book.add("after_step", step, sample)
        losses.append(total)
        step_times.append((tr.now() - t0) / 1e9)
        tr.flush()
    result = {"losses": losses, "step_times": step_times, "memory": book.summary(),
              "comm": tr.comm_totals, "layout": strategy.layout(), "notes": strategy.notes,
              "coords": c, "clock_error_ns": tr.clock_error_ns,
              "process_memory": process_memory(), "pipeline_peak": rt.peak}
    if os.environ.get("PARALAB_DUMP_PARAMS") == "1":
        dump_params(ctx, strategy, stages)
    tr.flush()
    dist.barrier()
    gathered = [None] * ctx.world
    dist.all_gather_object(gathered, result)
    if ctx.rank == 0:
        result["summary"] = _str_keys(summarize(ctx, gathered, schedule))
    return result


def _loss_context(p):
    """Native vocab parallelism: cross-entropy on vocab-sharded DTensor logits needs
    `loss_parallel()` around forward and backward."""
    if p.engine == "native" and p.vocab_parallel:
        from torch.distributed.tensor.parallel import loss_parallel
        return loss_parallel()
    return contextlib.nullcontext()


def _str_keys(obj):
    """JSON-ready: dict keys as strings, tuples as lists, all the way down."""
    if isinstance(obj, dict):
        return {str(k): _str_keys(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_str_keys(v) for v in obj]
    return obj


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


def dump_params(ctx, strategy, stages) -> None:
    """PARALAB_DUMP_PARAMS=1: every rank writes `params-rank{R}.pt` {full-model name: local
    tensor (a tp shard where sharded)} plus its coords, for the multi-rank tests."""
    dump_tensors(ctx, strategy.full_parameters(), stages, "params")


def dump_tensors(ctx, full: dict, stages, what: str) -> None:
    """`{what}-rank{R}.pt`: {full-model name: local tensor (a tp shard where sharded)}."""
    out = {global_name(n, stages): t.detach().float().cpu() for n, t in full.items()}
    torch.save({"coords": ctx.dims.coords(ctx.rank), "tp": ctx.dims.tp, "params": out},
               ctx.out / f"{what}-rank{ctx.rank}.pt")


def summarize(ctx, per_rank: list[dict], schedule: str) -> dict:
    from jobs.train import summarize as dp_summary
    spec, dims = ctx.spec, ctx.dims
    p = spec.parallel
    out = dp_summary(ctx, [{**r, "losses": [x or 0.0 for x in r["losses"]]} for r in per_rank])
    # the rank holding the last stage (pp rank 0 in zbv's V placement) reports the loss
    last_pp = schedules.rank_of(dims.pp * p.virtual_stages - 1, dims.pp, p.virtual_stages,
                                schedules.placement_of(schedule))
    last = [r for r in per_rank if r["coords"]["pp"] == last_pp and r["coords"]["tp"] == 0]
    out["loss"] = [sum(r["losses"][s] for r in last) / len(last)
                   for s in range(spec.train.steps)]
    measured = bubbles.summary(ctx.out)
    steps = list(range(1 if spec.train.steps > 1 else 0, spec.train.steps))
    times = bubbles.measured_stage_times(bubbles.load(ctx.out), steps,
                                         dims.pp * p.virtual_stages)
    if not any(times["t_f"]):
        times = {"t_f": 1.0, "t_b_input": 1.0, "t_b_weight": 0.0}
    sim = schedules.simulate(schedule, dims.pp, p.microbatches, p.virtual_stages, **times)
    out["pipeline"] = {
        "schedule": schedule, "p": dims.pp, "m": p.microbatches, "v": p.virtual_stages,
        "stages": {str(s): {"idle_fraction": measured["bubble"].get(str(s), {}).get(
            "idle_fraction"), "simulated_idle_fraction": sim["ranks"][s]["idle_fraction"],
            **measured["memory"].get(str(s), {})} for s in range(dims.pp)},
        "closed_form_bubble": schedules.closed_form_bubble(schedule, dims.pp, p.microbatches,
                                                           p.virtual_stages),
        "simulated_with": sim["times"], "convention": schedules.CONVENTION,
        "partition": ctx.partition}
    out["bytes_by_axis"] = measured["bytes_by_axis"]
    out["mesh"] = {"pp": dims.pp, "dp": dims.dp, "tp": dims.tp}
    return out
