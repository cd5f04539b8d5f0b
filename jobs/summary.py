"""The run summary rank 0 writes (`summary.json`), from every rank's loop result: losses,
step times, memory, bytes, the seeds' formulas next to the measured figures (`formula_check`)
and, under model parallelism, the pipeline's layout (schedule, p, m, v, closed-form bubble)
and each rank's own pipeline peaks (in-flight micro-batches, activation and receive-buffer
bytes, counted by its runtime). What is measured from the traces (the bubble per stage,
bytes per mesh axis) is not here: the analysis (`analysis.json`: stage_bubbles, axis_bytes)
is its one home."""

from __future__ import annotations

import torch

from jobs import schedules
from jobs.context import RunContext
from jobs.parallel.formulas import NATIVE_DEVIATIONS, comm_per_step, model_state
from jobs.spec import JobSpec
from jobs.strategies import DP_STRATEGIES
from jobs.theory.memory import MEMORY_MODELS


def backend_provenance(backend: str) -> dict:
    """Versions the run depended on, for the run's provenance (the worker adds host facts)."""
    info = {"torch": torch.__version__, "process_group_backend": backend,
            "gloo": f"bundled with torch {torch.__version__}" if backend == "gloo" else None}
    if torch.cuda.is_available():
        info.update(cuda=torch.version.cuda, device_name=torch.cuda.get_device_name(),
                    nccl=".".join(map(str, torch.cuda.nccl.version())))
    return info


def loss_weight(ctx: RunContext, rank: int, schedule: str | None) -> float:
    """This rank's share of the global-batch loss: the loss of a step is the weighted sum of
    the ranks' local losses (each the mean over that rank's samples). Data parallel: one rank
    per DP replica, 1/dp each (replicas hold equal sizes). Model parallel: the ranks holding
    the last pipeline stage (pp rank 0 in zbv's V placement) at tp 0, equally. The one rule the
    summary, the per-step log lines and the traces' `step` spans (`loss_weight`) all use."""
    dims, world = ctx.dims, ctx.world
    if schedule is None:
        stride = max(1, world // dims.dp)
        return 1.0 / dims.dp if rank % stride == 0 else 0.0
    p = ctx.spec.parallel
    last_pp = schedules.rank_of(dims.pp * p.virtual_stages - 1, dims.pp, p.virtual_stages,
                                schedules.placement_of(schedule))

    def holds(r: int) -> bool:
        c = dims.coords(r)
        return c["pp"] == last_pp and c["tp"] == 0

    if not holds(rank):
        return 0.0
    return 1.0 / sum(holds(r) for r in range(world))


def global_losses(ctx: RunContext, per_rank: list[dict], schedule: str | None) -> list[float]:
    w = [loss_weight(ctx, r, schedule) for r in range(ctx.world)]
    return [sum(w[r] * (per_rank[r]["losses"][s] or 0.0) for r in range(ctx.world) if w[r])
            for s in range(ctx.spec.train.steps - ctx.start_step)]


def summarize(ctx: RunContext, per_rank: list[dict], comp) -> dict:
    if comp.model_parallel:
        return _str_keys(summarize_mp(ctx, per_rank, comp.schedule))
    return summarize_dp(ctx, per_rank)


def summarize_dp(ctx: RunContext, per_rank: list[dict]) -> dict:
    spec, world = ctx.spec, ctx.world
    losses = global_losses(ctx, per_rank, None)
    step_times = [max(r["step_times"][s] for r in per_rank)
                  for s in range(spec.train.steps - ctx.start_step)]
    steady = step_times[1:] or step_times
    mean_t = sum(steady) / len(steady)
    return {"strategy": spec.strategy, "engine": spec.parallel.engine, "world_size": world,
            "backend": ctx.backend, "precision": spec.train.precision, "loss": losses,
            "step_time_s": step_times, "mean_step_time_s": mean_t,
            "tokens_per_s": spec.tokens_per_step / mean_t if mean_t > 0 else None,
            "psi": per_rank[0]["layout"].get("psi"),
            "ranks": [{"rank": i, **{k: r[k] for k in ("coords", "comm", "memory", "layout",
                                                        "clock_error_ns", "process_memory")}}
                      for i, r in enumerate(per_rank)],
            "notes": per_rank[0]["notes"],
            "formula_check": formula_check(spec, per_rank, ctx.start_step),
            "provenance": backend_provenance(ctx.backend), **resumed(ctx)}


def resumed(ctx: RunContext) -> dict:
    """Where the losses start: `loss[i]` is global step start_step + i (a resumed run lists
    its own steps only); resumed_from is the step of the checkpoint it continued from."""
    from jobs.ckpt import attempt_number
    return {"start_step": ctx.start_step,
            "resumed_from": ctx.start_step if ctx.start_step else None,
            "attempt": attempt_number()}


def summarize_mp(ctx: RunContext, per_rank: list[dict], schedule: str) -> dict:
    spec, dims = ctx.spec, ctx.dims
    p = spec.parallel
    out = summarize_dp(ctx, [{**r, "losses": [x or 0.0 for x in r["losses"]]}
                             for r in per_rank])
    out["loss"] = global_losses(ctx, per_rank, schedule)
    out["pipeline"] = {
        "schedule": schedule, "p": dims.pp, "m": p.microbatches, "v": p.virtual_stages,
        "closed_form_bubble": schedules.closed_form_bubble(schedule, dims.pp, p.microbatches,
                                                           p.virtual_stages),
        "convention": schedules.CONVENTION, "partition": ctx.partition}
    for row, r in zip(out["ranks"], per_rank, strict=True):
        if "pipeline_peak" in r:  # the rank's runtime counted them, every step, traced or not
            row["pipeline_peak"] = dict(r["pipeline_peak"])
    out["mesh"] = {"pp": dims.pp, "dp": dims.dp, "tp": dims.tp}
    return out


def _str_keys(obj):
    """JSON-ready: dict keys as strings, tuples as lists, all the way down."""
    if isinstance(obj, dict):
        return {str(k): _str_keys(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_str_keys(v) for v in obj]
    return obj


def formula_check(spec: JobSpec, per_rank: list[dict], start: int = 0) -> dict:
    """Per rank: the seeds' traffic per step and model-state bytes next to what was measured
    (trace records; state after the last step), with the deviation and, for native engines,
    why it deviates. Reference engines match exactly up to the padding shown."""
    label, t = spec.strategy, spec.train
    # MoE: the DP formulas hold for what the DP strategy holds (ep > 1: the non-expert Ψ)
    label = label.removesuffix("+moe-ep").removesuffix("+moe")
    # CP: the DP strategy all-reduces over the whole dp group (CP ranks included), so its
    # formulas hold as they are; `cp` alone is ddp with dp = cp
    label = "ddp" if label == "cp" else label.removesuffix("+cp")
    if label not in DP_STRATEGIES or label == "single":
        return {}
    n = spec.parallel.dp
    psi = per_rank[0]["layout"]["psi"]
    elem = 2 if t.precision == "bf16" else 4
    rows = []
    for i, r in enumerate(per_rank):
        f = comm_per_step(label, n, psi * elem, rank=i,
                          rounds=t.grad_accum * spec.parallel.microbatches)
        steps = {int(k): v for k, v in r["comm_by_step"].items() if int(k) >= 0}
        sent = [steps.get(s, [0.0, 0.0])[0] for s in range(start, t.steps)]
        recv = [steps.get(s, [0.0, 0.0])[1] for s in range(start, t.steps)]
        fm = model_state(label, n, psi, t.precision, t.fp32_grads, rank=i)
        if spec.parallel.ep > 1:  # plus the rank's experts, unsharded (EP runs in fp32)
            fm = {k: v + r["layout"]["expert_psi_local"] * MEMORY_MODELS["fp32"][k]
                  for k, v in fm.items()}
        last = [x for x in r["memory"]["phases"] if x["phase"] == "after_step"][-1]
        mm = {k: last.get(k, 0) for k in fm}
        rows.append({"rank": i, "bytes_sent_formula": f["bytes_sent"],
                     "bytes_recv_formula": f["bytes_recv"], "bytes_sent_per_step": sent,
                     "bytes_recv_per_step": recv,
                     "bytes_sent_deviation": [x - f["bytes_sent"] for x in sent],
                     "memory_formula": fm, "memory_measured": mm,
                     "memory_deviation": {k: mm[k] - fm[k] for k in fm}})
        if spec.parallel.ep > 1:
            rows[-1]["ep"] = ep_check(spec, r, start)
    engine = spec.parallel.engine
    key = DP_STRATEGIES[label].family  # fsdp deviates as zero3 does
    return {"strategy": label, "engine": engine, "psi": psi, "comm_ops": f["ops"],
            "padding_elems": per_rank[0]["layout"].get("padding_elems", 0),
            "explanation": (NATIVE_DEVIATIONS.get(key, "") if engine == "native" else
                            "reference engine: equals the seeds' formula (padding aside)")
            + ("; expert parallelism: Ψ is the non-expert parameters (axis dp), the memory "
               "formula adds the rank's experts unsharded (jobs.theory.moe.ep_model_state), "
               "their traffic is on axes edp (exact) and ep (uniform routing: an expectation, "
               "see `ep`)" if spec.parallel.ep > 1 else ""),
            "ranks": rows}


def ep_check(spec: JobSpec, r: dict, start: int = 0) -> dict:
    """One rank's expert-parallel traffic per step next to predict()'s: the expert-gradient
    all-reduce on edp (exact) and the all-to-all on ep (its uniform-routing expectation; the
    group payload is checked exactly against a2a_bytes in tests/moe)."""
    from jobs.theory import predict
    try:
        comps = predict(spec)["comm"]["components"]
    except Exception as exc:  # noqa: BLE001 - a theory gap must not fail the run's summary
        return {"error": f"{type(exc).__name__}: {exc}"}
    out = {}
    for axis in ("edp", "ep"):
        steps = {int(k): v for k, v in (r.get("comm_by_step_ep") or {}).get(axis, {}).items()}
        sent = [steps.get(s, [0.0, 0.0])[0] for s in range(start, spec.train.steps)]
        out[axis] = {"bytes_sent_formula": comps[axis], "bytes_sent_per_step": sent,
                     "bytes_sent_deviation": [x - comps[axis] for x in sent]}
    out["ep"]["convention"] = "uniform-routing (an expectation: routing decides the rest)"
    return out
