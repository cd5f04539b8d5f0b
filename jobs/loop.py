"""The one training loop: every strategy and composition runs through `train_loop`.

    strategy.zero_grad()
    loss = runner.run(microbatches)      # forward / backward (jobs/runners.py)
    strategy.finish_grads()              # gradients reduced and averaged over dp
    strategy.step()                      # optimizer + whatever parameter sync it needs

Memory is sampled at `init`, `after_forward` (direct runner, per micro-batch, with the bytes
autograd saved), `after_backward` and `after_step` (with the pipeline's peak activation bytes
under model parallelism). With PARALAB_DUMP_PARAMS=1 the step-0 gradients are dumped for the
correctness gate (jobs/dumps.py), after step 0's span: their gathers are not traced.

Bounded tracing (spec `trace`, jobs/trace_schedule.py): `tr.begin_step` says whether a step is
traced in detail; every step, traced or not, ends with one `scalars` record (loss, step time,
tokens/s, memory peaks), so loss and step time exist for every step of the run."""

from __future__ import annotations

import json
import os

from jobs.ckpt import after_step
from jobs.context import RunContext
from jobs.data import local_microbatches
from jobs.dumps import dump_grads
from jobs.faults import of as faults_of
from jobs.memory import MemoryBook, process_memory
from jobs.summary import loss_weight


def train_loop(ctx: RunContext, comp) -> dict:
    """Per-rank results (rank 0 merges them into the summary, jobs/summary.py)."""
    spec, tr, strategy, runner = ctx.spec, ctx.tracer, comp.strategy, comp.runner
    rounds = spec.train.grad_accum * spec.parallel.microbatches
    dp_rank = ctx.dims.coords(ctx.rank)["dp"]
    book = MemoryBook()
    weight = loss_weight(ctx, ctx.rank, comp.schedule if comp.model_parallel else None)
    losses, step_times = [], []
    tr.configure(spec.trace)
    tokens = spec.tokens_per_step
    # the profiler counts every collective of the run: no dump gathers under it
    dump = (os.environ.get("PARALAB_DUMP_PARAMS") == "1"
            and os.environ.get("PARALAB_PROFILE") != "1")

    def sample(phase: str, **extra) -> None:
        s = {**strategy.state_bytes(), **extra}
        book.add(phase, tr.step, s)
        tr.memory(phase=phase, **s)  # adds RSS / CUDA allocator figures

    sample("init")
    prof = None
    if os.environ.get("PARALAB_PROFILE") == "1":  # an independent count of collectives (tests)
        from torch.profiler import ProfilerActivity, profile
        prof = profile(activities=[ProfilerActivity.CPU])
        prof.__enter__()
    faults = faults_of(tr)  # injected faults and the non-finite check (jobs/faults.py)
    for step in range(ctx.start_step, spec.train.steps):
        if faults.data_ends(step):
            break
        tr.begin_step(step)
        mbs = local_microbatches(spec, step, dp_rank, ctx.dims.dp, rounds, ctx.device)
        strategy.zero_grad()
        with tr.span("step", cat="step") as rec, strategy.comm_context(), \
                comp.loss_context():
            faults.at_step(step)
            loss = runner.run(mbs, sample)
            if loss is not None and weight:  # the live page's loss (jobs.summary.loss_weight)
                rec.update(loss=loss, loss_weight=weight)
            with tr.span("grad_sync", cat="comm"):
                strategy.finish_grads()
            sample("after_backward")
            strategy.step()
            sample("after_step", **runner.memory())
        faults.after_step(step, loss, strategy)
        if step == 0 and dump:  # outside the traced step: the gathers are not the run's
            dump_grads(ctx, comp)  # (the optimizer step leaves the reduced gradients alone)
        losses.append(loss)
        if comp.model_parallel or getattr(tr, "cuda", False):
            tr.flush()  # CUDA-event records resolve on the main thread only
        # the step span's duration (device time once resolved): the number the analysis reads
        step_times.append(rec["dur_ns"] / 1e9)
        # every step, traced or not; the loss only where the step span would carry it
        tr.scalars(step_s=step_times[-1], tokens=tokens, tokens_per_s=tokens / step_times[-1]
                   if step_times[-1] > 0 else None,
                   **({"loss": loss, "loss_weight": weight}
                      if loss is not None and weight else {}))
        if weight:  # a line per step as it ends (the log is live); this rank's own samples
            print(f"step {step} loss {loss:.6f} (this rank's samples) time "
                  f"{step_times[-1] * 1e3:.1f} ms", flush=True)
        after_step(ctx, comp, step)  # test-only crash, checkpoint (jobs/ckpt.py)
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
            # expert parallelism's axes, for formula_check (jobs/summary.py)
            "comm_by_step_ep": {a: tr.comm_by_step[a] for a in ("ep", "edp")
                                if a in tr.comm_by_step},
            "coords": ctx.dims.coords(ctx.rank), "clock_error_ns": tr.clock_error_ns,
            "process_memory": process_memory(), **runner.result()}
