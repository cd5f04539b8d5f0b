"""Worker for test_recv_buffers.py. argv: OUT
Every schedule (p = world) on the mlp through the reference runtime, 2 steps: per run and rank
the measured peak of live receive buffers (`peak["recv_buffer_bytes"]`) and the parameters'
error against a single-process run. Run "1f1b/float64" trains in float64 (the receive buffers
follow the run's dtype: 8 bytes an element)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from pp_worker import GB, rel_err

from jobs import schedules
from jobs.entry import exit_now
from jobs.models import model_module
from jobs.parallel.pipeline.runtime import PipelineRuntime
from jobs.parallel.pipeline.stage import split_stages
from jobs.spec import ModelSpec

MS = ModelSpec(arch="mlp", layers=4, hidden=16)
STEPS = 2


def cases(p: int):
    yield "naive", 1, 1
    yield "gpipe", 4, 1
    yield "1f1b", 4, 1
    yield "zero-bubble", 4, 1
    if p == 2:  # layers 4 = p * v
        yield "interleaved", 4, 2
        yield "zbv", 4, 2


def run(schedule, m, v, p, rank, dtype):
    mod = model_module("mlp")
    full = mod.build(MS, 0).to(dtype)
    names = {id(q): n for n, q in full.named_parameters()}
    stages = split_stages(full, p, v, rank, placement=schedules.placement_of(schedule))
    params = [q for st in stages.values() for q in st.parameters()]
    rt = PipelineRuntime(stages, schedule=schedule, p=p, m=m, v=v, rank=rank,
                         pp_ranks=list(range(p)), loss_fn=mod.loss_fn,
                         act_shape=(GB // m, MS.hidden))
    opt = torch.optim.SGD(params, lr=0.1)
    for step in range(STEPS):
        x, y = mod.batch(MS, GB, 0, step)
        opt.zero_grad()
        rt.step(list(zip(x.to(dtype).chunk(m), y.to(dtype).chunk(m), strict=True)))
        opt.step()
    return {names[id(q)]: q.detach() for q in params}, rt


def reference(dtype):
    mod = model_module("mlp")
    model = mod.build(MS, 0).to(dtype)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS):
        x, y = mod.batch(MS, GB, 0, step)
        opt.zero_grad()
        mod.loss_fn(model(x.to(dtype)), y.to(dtype)).backward()
        opt.step()
    return {n: q.detach() for n, q in model.named_parameters()}


def main(out: Path):
    dist.init_process_group("gloo")
    rank, p = dist.get_rank(), dist.get_world_size()
    res = {}
    runs = [(s, m, v, torch.float32) for s, m, v in cases(p)] + [("1f1b", 4, 1, torch.float64)]
    refs = {dt: reference(dt) for dt in (torch.float32, torch.float64)}
    for schedule, m, v, dt in runs:
        got, rt = run(schedule, m, v, p, rank, dt)
        name = schedule + ("/float64" if dt == torch.float64 else "")
        res[name] = {"m": m, "v": v, "err": rel_err(got, refs[dt]),
                     "elem_bytes": dt.itemsize, "dtype": str(rt.dtype),
                     "recv_buffer_bytes": rt.peak["recv_buffer_bytes"]}
    allres = [None] * p
    dist.all_gather_object(allres, res)
    if rank == 0:
        (out / "result.json").write_text(json.dumps({"ranks": allres, "world": p}))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    exit_now(0)  # see jobs.entry.exit_now: no teardown abort after a clean run
