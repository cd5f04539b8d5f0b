"""Entry point of a training job, run on every rank by torchrun:

    torchrun --nproc-per-node N -m jobs.train --spec SPEC.json --out DIR

Writes `DIR/trace-rank{R}.jsonl` (one JSON object per line, schema in docs/trace-schema.md),
`DIR/summary.json` (rank 0) and, when a rank fails, `DIR/error-rank{R}.txt` with its traceback
so the worker can put the failing rank's error into the run's error text.

Flow: init -> dims/mesh -> tracer -> plain model -> strategy (jobs/parallel/*) -> loop ->
summary. How a strategy plugs in: docs/strategies.md.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from jobs.data import local_microbatches
from jobs.dims import ParallelDims
from jobs.entry import exit_now, job_main
from jobs.memory import MemoryBook, SavedTensorCounter, param_storages, process_memory
from jobs.models import model_module
from jobs.spec import JobSpec
from jobs.testbug import mb_divisor
from jobs.trace import Tracer


@dataclass
class RunContext:
    """Everything a strategy or a model-parallel runner needs; passed explicitly."""

    spec: JobSpec
    out: Path
    rank: int
    world: int
    backend: str
    device: torch.device
    dims: ParallelDims
    mesh: object
    tracer: Tracer
    partition: dict | None = None  # pipeline stage split, set by model_parallel.build_stages


def build_strategy(ctx: RunContext, model):
    """The data-parallel strategy for `ctx.spec` applied to a plain model (DP axis only)."""
    p, t = ctx.spec.parallel, ctx.spec.train
    group = ctx.mesh["dp"].get_group() if ctx.dims.dp > 1 else None
    kw = {"lr": t.lr, "precision": t.precision, "fp32_grads": t.fp32_grads,
          "bucket_mb": p.bucket_mb, "optimizer": t.optimizer}
    if ctx.dims.dp == 1:
        from jobs.parallel.data import Single
        return Single(model, group, ctx.tracer, **kw)
    if p.engine == "native":
        from jobs.parallel.native import apply_native
        return apply_native(model, ctx.mesh["dp"], ctx.tracer, spec=ctx.spec, **kw)
    if p.zero_stage:
        from jobs.parallel.zero import apply_zero
        return apply_zero(model, group, ctx.tracer, stage=p.zero_stage, **kw)
    from jobs.parallel.data import apply_data_parallel
    return apply_data_parallel(model, group, ctx.tracer, mode=p.dp_mode, **kw)


def apply_activation_checkpointing(model) -> None:
    """Recompute each repeated layer's activations in backward (non-reentrant checkpoint)."""
    from torch.utils.checkpoint import checkpoint

    from jobs.models import layer_list
    for blk in layer_list(model) or []:
        fwd = blk.forward
        blk.forward = lambda *a, _f=fwd: checkpoint(_f, *a, use_reentrant=False)


def model_layers(strategy):
    from jobs.models import layer_list
    m = strategy.model
    for _ in range(3):  # unwrap DDP (.module) / ZeRO-3 root (.inner)
        if layer_list(m) is not None:
            return layer_list(m)
        m = getattr(m, "module", None) or getattr(m, "inner", None)
        if m is None:
            break
    return None


class LayerSpans:
    """Per-layer spans from module hooks (cheap): `forward.layer` around each repeated layer's
    forward, and `backward.layer` from the moment the gradient of its output arrives until
    the gradient of the next-lower layer's output does (or backward ends). They show where
    ZeRO-3 / FSDP2 gathers and DDP bucket launches sit inside forward and backward."""

    def __init__(self, tr, layers):
        self.tr, self.open = tr, None
        for i, layer in enumerate(layers or []):
            layer.register_forward_pre_hook(lambda m, a, i=i: self._fwd_start(m, i))
            layer.register_forward_hook(lambda m, a, out, i=i: self._fwd_end(m, out, i))

    def _fwd_start(self, m, i) -> None:
        m._trace_span = self.tr.span("forward.layer", layer=i)
        m._trace_span.__enter__()

    def _fwd_end(self, m, out, i) -> None:
        span = getattr(m, "_trace_span", None)
        if span is not None:
            m._trace_span = None
            span.__exit__(None, None, None)
        if isinstance(out, torch.Tensor) and out.requires_grad and torch.is_grad_enabled():
            out.register_hook(lambda g, i=i: self._bwd_layer(i))

    def _bwd_layer(self, i) -> None:
        self.end_backward()
        self.open = self.tr.span("backward.layer", layer=i)
        self.open.__enter__()

    def end_backward(self) -> None:
        if self.open is not None:
            span, self.open = self.open, None
            span.__exit__(None, None, None)


def train_loop(ctx: RunContext, strategy, loss_fn) -> dict:
    """The DP training loop; returns per-rank results (rank 0 merges them into the summary)."""
    spec, tr = ctx.spec, ctx.tracer
    rounds = spec.train.grad_accum * spec.parallel.microbatches
    dp_rank = ctx.dims.coords(ctx.rank)["dp"]
    book = MemoryBook()
    saved = SavedTensorCounter()
    if hasattr(strategy, "saved_counter"):
        strategy.saved_counter = saved  # strategies with their own saved-tensor hooks count too
    losses, step_times = [], []

    def sample(phase: str, **extra) -> None:
        s = {**strategy.state_bytes(), **extra}
        book.add(phase, tr.step, s)
        tr.memory(phase=phase, **s)  # adds RSS / CUDA allocator figures

    sample("init")
    params_seen = param_storages(strategy.model)
    layer_spans = LayerSpans(tr, model_layers(strategy))
    prof = None
    if os.environ.get("PARALAB_PROFILE") == "1":  # an independent count of collectives (tests)
        from torch.profiler import ProfilerActivity, profile
        prof = profile(activities=[ProfilerActivity.CPU])
        prof.__enter__()
    for step in range(spec.train.steps):
        tr.step = step
        t0 = tr.now()
        mbs = local_microbatches(spec, step, dp_rank, ctx.dims.dp, rounds, ctx.device)
        strategy.zero_grad()
        loss_sum = torch.zeros((), dtype=torch.float64, device=ctx.device)
        with tr.span("step", cat="step"), strategy.comm_context():
            for i, (x, y) in enumerate(mbs):
                tr.microbatch = i
                sync = strategy.no_sync() if i < rounds - 1 else contextlib.nullcontext()
                with sync:
                    saved.reset(params_seen)
                    with tr.span("forward"), saved.hooks():
                        loss = loss_fn(strategy.forward(x).float(), y)
                    sample("after_forward", activations=saved.bytes)
                    with tr.span("backward"):
                        strategy.backward(loss / mb_divisor(rounds))
                        layer_spans.end_backward()
                loss_sum += loss.detach().double()
            tr.microbatch = None
            with tr.span("grad_sync", cat="comm"):
                strategy.finish_grads()
            if step == 0 and os.environ.get("PARALAB_DUMP_PARAMS") == "1":
                grads = strategy.full_grads()  # the correctness gate's step-0 gradients
                if ctx.rank == 0:
                    torch.save(grads, ctx.out / "grads-step0.pt")
            sample("after_backward")
            strategy.step()
            sample("after_step")
        losses.append(loss_sum.item() / rounds)
        step_times.append((tr.now() - t0) / 1e9)
        if getattr(tr, "cuda", False):
            tr.flush()  # CUDA-event records resolve on the main thread only
    if prof is not None:
        prof.__exit__(None, None, None)
        counts: dict[str, int] = {}
        for ev in prof.events():
            if ev.name.startswith("gloo:"):
                counts[ev.name] = counts.get(ev.name, 0) + 1
        (ctx.out / f"profile-counts-rank{ctx.rank}.json").write_text(json.dumps(counts))
    return {"losses": losses, "step_times": step_times, "memory": book.summary(),
            "comm": tr.comm_totals, "layout": strategy.layout(), "notes": strategy.notes,
            "comm_by_step": tr.comm_by_step.get("dp", {}),
            "coords": ctx.dims.coords(ctx.rank), "clock_error_ns": tr.clock_error_ns,
            "process_memory": process_memory()}


def tokens_per_step(spec: JobSpec) -> int:
    return spec.train.global_batch * (spec.model.seq_len if spec.model.arch == "gpt" else 1)


def backend_provenance(backend: str) -> dict:
    """Versions the run depended on, for the run's provenance (the worker adds host facts)."""
    info = {"torch": torch.__version__, "process_group_backend": backend,
            "gloo": f"bundled with torch {torch.__version__}" if backend == "gloo" else None}
    if torch.cuda.is_available():
        info.update(cuda=torch.version.cuda, device_name=torch.cuda.get_device_name(),
                    nccl=".".join(map(str, torch.cuda.nccl.version())))
    return info


def summarize(ctx: RunContext, per_rank: list[dict]) -> dict:
    spec, world = ctx.spec, ctx.world
    dp = ctx.dims.dp
    # loss: each rank's value is the mean over its samples; the global-batch mean averages the
    # DP replicas (equal sizes), so it is the same number whatever the strategy.
    losses = [sum(r["losses"][s] for r in per_rank[:: max(1, world // dp)]) / dp
              for s in range(spec.train.steps)]
    step_times = [max(r["step_times"][s] for r in per_rank) for s in range(spec.train.steps)]
    steady = step_times[1:] or step_times
    mean_t = sum(steady) / len(steady)
    return {"strategy": spec.strategy, "engine": spec.parallel.engine, "world_size": world,
            "backend": ctx.backend, "precision": spec.train.precision, "loss": losses,
            "step_time_s": step_times, "mean_step_time_s": mean_t,
            "tokens_per_s": tokens_per_step(spec) / mean_t if mean_t > 0 else None,
            "psi": per_rank[0]["layout"].get("psi"),
            "ranks": [{"rank": i, **{k: r[k] for k in ("coords", "comm", "memory", "layout",
                                                        "clock_error_ns", "process_memory")}}
                      for i, r in enumerate(per_rank)],
            "notes": per_rank[0]["notes"], "formula_check": formula_check(spec, per_rank),
            "provenance": backend_provenance(ctx.backend)}


def formula_check(spec: JobSpec, per_rank: list[dict]) -> dict:
    """Per rank: the seeds' traffic per step and model-state bytes next to what was measured
    (trace records; state after the last step), with the deviation and, for native engines,
    why it deviates. Reference engines match exactly up to the padding shown."""
    from jobs.parallel.formulas import NATIVE_DEVIATIONS, comm_per_step, model_state
    label, t = spec.strategy, spec.train
    if label not in ("dp-ps", "dp-allreduce", "ddp", "zero1", "zero2", "zero3", "fsdp"):
        return {}
    n = spec.parallel.dp
    psi = per_rank[0]["layout"]["psi"]
    elem = 2 if t.precision == "bf16" else 4
    rows = []
    for i, r in enumerate(per_rank):
        f = comm_per_step(label, n, psi * elem, rank=i,
                          rounds=t.grad_accum * spec.parallel.microbatches)
        steps = {int(k): v for k, v in r["comm_by_step"].items() if int(k) >= 0}
        sent = [steps.get(s, [0.0, 0.0])[0] for s in range(t.steps)]
        recv = [steps.get(s, [0.0, 0.0])[1] for s in range(t.steps)]
        fm = model_state(label, n, psi, t.precision, t.fp32_grads, rank=i)
        last = [x for x in r["memory"]["phases"] if x["phase"] == "after_step"][-1]
        mm = {k: last.get(k, 0) for k in fm}
        rows.append({"rank": i, "bytes_sent_formula": f["bytes_sent"],
                     "bytes_recv_formula": f["bytes_recv"], "bytes_sent_per_step": sent,
                     "bytes_recv_per_step": recv,
                     "bytes_sent_deviation": [x - f["bytes_sent"] for x in sent],
                     "memory_formula": fm, "memory_measured": mm,
                     "memory_deviation": {k: mm[k] - fm[k] for k in fm}})
    engine = spec.parallel.engine
    key = "zero3" if label == "fsdp" else label
    return {"strategy": label, "engine": engine, "psi": psi, "comm_ops": f["ops"],
            "padding_elems": per_rank[0]["layout"].get("padding_elems", 0),
            "explanation": (NATIVE_DEVIATIONS.get(key, "") if engine == "native" else
                            "reference engine: equals the seeds' formula (padding aside)"),
            "ranks": rows}


def run(spec: JobSpec, out: Path) -> None:
    backend = spec.runtime.backend
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    try:
        run_in_group(spec, out, backend)
    finally:
        dist.destroy_process_group()


def run_in_group(spec: JobSpec, out: Path, backend: str) -> dict | None:
    """One run inside an initialised default process group; returns the summary on rank 0.
    With PARALAB_DUMP_PARAMS=1 rank 0 also writes `params-final.pt` (full fp32 parameters)."""
    out.mkdir(parents=True, exist_ok=True)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    dims = ParallelDims.from_spec(spec, world)
    mesh = dims.build_mesh(device.type)
    tracer = Tracer(out, rank, world, coords=dims.coords(rank),
                    meta={"backend": backend, "spec": spec.to_dict(), "strategy": spec.strategy},
                    cuda_events=device.type == "cuda")
    ctx = RunContext(spec, out, rank, world, backend, device, dims, mesh, tracer)
    summary = None
    try:
        if dims.tp > 1 or dims.pp > 1:
            # Model parallelism (and 3D) takes over the loop: see docs/strategies.md.
            runner = importlib.import_module("jobs.parallel.model_parallel")
            result = runner.run(ctx)
        else:
            mod = model_module(spec.model.arch)
            model = mod.build(spec.model, spec.train.seed).to(device)
            if spec.train.activation_checkpointing:
                apply_activation_checkpointing(model)
            strategy = build_strategy(ctx, model)
            result = train_loop(ctx, strategy, mod.loss_fn)
            if os.environ.get("PARALAB_DUMP_PARAMS") == "1":
                full = strategy.full_parameters()
                if rank == 0:
                    torch.save(full, out / "params-final.pt")
        gathered: list = [None] * world
        dist.all_gather_object(gathered, result)
        if rank == 0:
            summary = result.get("summary") if "summary" in result else summarize(ctx, gathered)
            (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
            for s, (loss, t) in enumerate(zip(summary.get("loss", []),
                                              summary.get("step_time_s", []), strict=False)):
                print(f"step {s} loss {loss:.6f} time {t * 1e3:.1f} ms", flush=True)
        tracer.close("ok")
    except BaseException as exc:
        tracer.close(f"error: {type(exc).__name__}")
        raise
    return summary


def main(argv: list[str] | None = None) -> int:
    return job_main("python -m jobs.train", "train", run, argv)


if __name__ == "__main__":
    exit_now(main())
