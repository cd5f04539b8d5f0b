"""Worker for test_pipeline.py. argv: OUT MODE
  correct: every schedule x arch (gpt, mlp, timed) on p = world vs a single-process run; zbv
           also on the native engine (torch's ScheduleZBVZeroBubble), key "<arch>/zbv/native"
  bubble:  timed layers sleeping `t` s (0 in the tests: only the order of actions is checked);
           traces per run under OUT/<run>/ for test_pipeline.py, one run per
           schedule plus "zbv-native" (p = 2 only, to keep the test short)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from jobs import schedules
from jobs.entry import exit_now
from jobs.models import model_module
from jobs.parallel.pipeline.native import NativePipeline
from jobs.parallel.pipeline.runtime import PipelineRuntime
from jobs.parallel.pipeline.stage import split_stages
from jobs.spec import ModelSpec
from jobs.trace import Tracer

GB = 8


def cases(p):
    yield "naive", 1, 1
    yield "gpipe", 4, 1
    yield "1f1b", 4, 1
    yield "interleaved", 4, 2
    yield "zero-bubble", 4, 1
    yield "zbv", 4, 2  # ZB-V: two chunks per rank in a V


def run_pipeline(ms, schedule, m, v, p, rank, steps, tracer=None, engine="reference"):
    mod = model_module(ms.arch)
    full = mod.build(ms, 0)
    names = {id(q): n for n, q in full.named_parameters()}
    stages = split_stages(full, p, v, rank, placement=schedules.placement_of(schedule))
    params = [q for st in stages.values() for q in st.parameters()]
    mb = GB // m
    shape = (mb, ms.seq_len, ms.hidden) if ms.arch == "gpt" else (mb, ms.hidden)
    if engine == "native":
        rt = NativePipeline(stages, schedule=schedule, p=p, m=m, v=v, rank=rank, pp_group=None,
                            loss_fn=mod.loss_fn, tracer=tracer)
    else:
        rt = PipelineRuntime(stages, schedule=schedule, p=p, m=m, v=v, rank=rank,
                             pp_ranks=list(range(p)), loss_fn=mod.loss_fn, act_shape=shape,
                             tracer=tracer)
    opt = torch.optim.Adam(params, lr=1e-3)
    for step in range(steps):
        if tracer is not None:
            tracer.step = step
            if engine == "native":
                # the simulator starts every rank together; torch's ZB-V lets rank 0 (which
                # finishes first) run ahead into the next step, so line the ranks up
                dist.barrier()
        x, y = mod.batch(ms, GB, 0, step)
        opt.zero_grad()
        rt.step(list(zip(x.chunk(m), y.chunk(m), strict=True)))
        opt.step()
    return {names[id(q)]: q.detach() for q in params}, rt.peak


def reference(ms, steps):
    mod = model_module(ms.arch)
    model = mod.build(ms, 0)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(steps):
        x, y = mod.batch(ms, GB, 0, step)
        opt.zero_grad()
        mod.loss_fn(model(x), y).backward()
        opt.step()
    return {n: q.detach() for n, q in model.named_parameters()}


def rel_err(got, ref):
    num = sum(float((g - ref[n]).pow(2).sum()) for n, g in got.items())
    den = sum(float(ref[n].pow(2).sum()) for n in got)
    return (num / den) ** 0.5


def main(out: Path, mode: str):
    dist.init_process_group("gloo")
    rank, p = dist.get_rank(), dist.get_world_size()
    res = {}
    if mode == "correct":
        specs = {"gpt": ModelSpec(arch="gpt", layers=4, hidden=16, heads=2, seq_len=8, vocab=32),
                 "mlp": ModelSpec(arch="mlp", layers=4, hidden=16),
                 "timed": ModelSpec(arch="timed", layers=4, hidden=16, t_forward=0.0,
                                    t_backward_input=0.0, t_backward_weight=0.0)}
        for arch, ms in specs.items():
            ref = reference(ms, 3)
            for schedule, m, v in cases(p):
                if ms.layers % (p * v):
                    continue
                got, peak = run_pipeline(ms, schedule, m, v, p, rank, 3)
                res[f"{arch}/{schedule}"] = {"err": rel_err(got, ref), **peak}
                if schedule == "zbv":
                    got, peak = run_pipeline(ms, schedule, m, v, p, rank, 3, engine="native")
                    res[f"{arch}/{schedule}/native"] = {"err": rel_err(got, ref), **peak}
    else:
        t = float(mode.split(":")[1]) if ":" in mode else 0.04
        runs = [(s, m, v, "reference", s) for s, m, v in cases(p)]
        runs += [(s, m, v, "native", f"{s}-native") for s, m, v in cases(p)
                 if s == "zbv" and p == 2]
        for schedule, m, v, engine, name in runs:
            # zbv needs m >= 2p-1 to reach its steady state: m = 8 at p = 4
            m = 2 if schedule == "naive" else max(4, 2 * p) if schedule == "zbv" else 4
            ms = ModelSpec(arch="timed", layers=p * v, hidden=8, t_forward=t,
                           t_backward_input=t, t_backward_weight=t)
            tracer = Tracer(out / name, rank, p, coords={"pp": rank, "dp": 0, "tp": 0},
                            meta={"backend": "gloo", "m": m, "v": v})
            _, peak = run_pipeline(ms, schedule, m, v, p, rank, 3, tracer, engine)
            tracer.close()
            res[name] = {"schedule": schedule, "engine": engine, "m": m, "v": v, "t": t,
                         **peak}
    allres = [None] * p
    dist.all_gather_object(allres, res)
    if rank == 0:
        (out / "result.json").write_text(json.dumps({"ranks": allres, "world": p}))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
    exit_now(0)  # see jobs.entry.exit_now: no teardown abort after a clean run
