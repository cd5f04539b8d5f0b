"""Worker for bench/bubble_real.py: real compute on p = 2 ranks, stages of equal cost.
argv: OUT HIDDEN LAYERS MB STEPS. Traces per schedule under OUT/<schedule>/.

The model is an MLP of identical h x h layers split evenly, so the two stages do the same
matrix work. The input batch requires a gradient, so the first stage also computes its first
layer's input gradient, as every other stage does (a pipeline's first stage otherwise skips it:
1/48 of its work here, which shows as about 2 points more idle on that stage). What still differs
is small next to it: the last stage's MSE loss, one b x h gloo p2p per boundary and action.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from jobs.entry import exit_now
from jobs.models import mlp
from jobs.parallel.pipeline.runtime import PipelineRuntime
from jobs.parallel.pipeline.stage import split_stages
from jobs.spec import ModelSpec
from jobs.trace import Tracer

CASES = (("gpipe", 4, 1), ("1f1b", 4, 1), ("interleaved", 4, 2))


def main(out: Path, hidden: int, layers: int, mb: int, steps: int) -> None:
    dist.init_process_group("gloo")
    rank, p = dist.get_rank(), dist.get_world_size()
    ms = ModelSpec(arch="mlp", layers=layers, hidden=hidden)
    res = {}
    for schedule, m, v in CASES:
        stages = split_stages(mlp.build(ms, 0), p, v, rank)
        tracer = Tracer(out / schedule, rank, p, coords={"pp": rank, "dp": 0, "tp": 0},
                        meta={"backend": "gloo", "m": m, "v": v})
        rt = PipelineRuntime(stages, schedule=schedule, p=p, m=m, v=v, rank=rank,
                             pp_ranks=list(range(p)), loss_fn=mlp.loss_fn,
                             act_shape=(mb, hidden), tracer=tracer)
        params = [q for st in stages.values() for q in st.parameters()]
        opt = torch.optim.SGD(params, lr=1e-4)
        cpu = []  # this thread's CPU seconds in each pipeline step: below its busy span time
        for step in range(steps):  # when the rank lost its core while computing
            tracer.step = step
            x, y = mlp.batch(ms, mb * m, 0, step)
            x.requires_grad_(True)
            opt.zero_grad()
            dist.barrier()  # both ranks start the step together
            c0 = time.thread_time()
            rt.step(list(zip(x.chunk(m), y.chunk(m), strict=True)))
            cpu.append(time.thread_time() - c0)
            opt.step()
        tracer.close()
        res[schedule] = {"m": m, "v": v, "cpu_s": cpu}
    every = [None] * p
    dist.all_gather_object(every, res)
    if rank == 0:
        cases = {s: {"m": c["m"], "v": c["v"], "cpu_s": {r: every[r][s]["cpu_s"]
                                                          for r in range(p)}}
                 for s, c in res.items()}
        (out / "result.json").write_text(json.dumps({"cases": cases, "world": p}))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    a = sys.argv
    main(Path(a[1]), int(a[2]), int(a[3]), int(a[4]), int(a[5]))
    exit_now(0)  # see jobs.entry.exit_now: no teardown abort after a clean run
