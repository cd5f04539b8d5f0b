"""Worker for test_tensor.py: TP / SP (reference and native) vs a single-process run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from jobs.entry import exit_now
from jobs.models import gpt
from jobs.parallel import tensor, vocab_parallel
from jobs.parallel.threed import FuncolRecorder
from jobs.spec import ModelSpec
from jobs.trace import Tracer

STEPS, GB = 3, 4
MS = ModelSpec(arch="gpt", layers=2, hidden=16, heads=4, seq_len=8, vocab=32)


def train(model, params, step_fn, loss_fn=gpt.loss_fn):
    opt = torch.optim.Adam(params, lr=1e-3)
    for step in range(STEPS):
        x, y = gpt.batch(MS, GB, 0, step)
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        step_fn()
        opt.step()
    return model


def rel_err(model, ref_sd, rank, size):
    num = den = 0.0
    for name, p in model.named_parameters():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        key = name.replace(".inner", "").replace("embed.0.", "embed.").replace("norm.0.", "norm.")
        ref = ref_sd[key]
        if full.shape != ref.shape:
            dim = 0 if full.shape[0] != ref.shape[0] else 1
            ref = ref.chunk(size, dim)[rank]
        num += float((full.detach() - ref).pow(2).sum())
        den += float(ref.pow(2).sum())
    return (num / den) ** 0.5


def main(out: Path):
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    group = dist.new_group(list(range(size)))
    m0 = gpt.build(MS, 0)
    train(m0, m0.parameters(), lambda: None)
    ref_sd = {k: v.detach() for k, v in m0.named_parameters()}
    res = {}
    for sp in (False, True):
        name = "sp" if sp else "tp"
        tracer = Tracer(out / name, rank, size, meta={"backend": "gloo"})
        m = tensor.apply_tensor_parallel(gpt.build(MS, 0), group, tracer=tracer,
                                         sequence_parallel=sp)
        train(m, m.parameters(),
              lambda m=m, t=tracer: tensor.allreduce_sequence_parallel_grads(m, group, t))
        tracer.close()
        res[name] = rel_err(m, ref_sd, rank, size)
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh("cpu", (size,), mesh_dim_names=("tp",))
        m = tensor.apply_native_tensor_parallel(gpt.build(MS, 0), mesh, sequence_parallel=sp)
        tracer = Tracer(out / ("native-" + name), rank, size, meta={"backend": "gloo"})
        with FuncolRecorder(tracer, "tp"):
            train(m, m.parameters(), lambda: None)
        tracer.close()
        res["native-" + name] = rel_err(m, ref_sd, rank, size)
        name = "vp-" + name  # vocabulary-parallel embedding, head and cross-entropy
        tracer = Tracer(out / name, rank, size, meta={"backend": "gloo"})
        m = tensor.apply_tensor_parallel(gpt.build(MS, 0), group, tracer=tracer,
                                         sequence_parallel=sp)
        start = vocab_parallel.apply_vocab_parallel(m, group, tracer=tracer,
                                                    sequence_parallel=sp)
        train(m, m.parameters(),
              lambda m=m, t=tracer: tensor.allreduce_sequence_parallel_grads(m, group, t),
              vocab_parallel.vocab_parallel_loss(group, tracer, start))
        tracer.close()
        res[name] = rel_err(m, ref_sd, rank, size)
    allres = [None] * size
    dist.all_gather_object(allres, res)
    if rank == 0:
        (out / "result.json").write_text(json.dumps({"ranks": allres, "world": size}))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    exit_now(0)  # see jobs.entry.exit_now: no teardown abort after a clean run
