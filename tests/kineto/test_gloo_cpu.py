"""CPU Kineto traces written by torch.profiler in a real 2-rank gloo job, read back.

The oracle is what the job did: 3 profiled steps, per step one all_reduce of ALLREDUCE_N
float32 elements and one of the model's 2-element bias gradient, 2 ranks.
"""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from jobs.kineto.reader import KinetoTraceReader
from jobs.kineto.records import load_ranks

WORLD = 2
STEPS = 3
ALLREDUCE_N = 37


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        path = os.path.join(out_dir, f"rank-{rank}.json.gz")
        # A schedule makes the profiler emit ProfilerStep#N spans; the trace is written
        # when the third step ends.
        with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
            profile_memory=True,
            schedule=torch.profiler.schedule(wait=0, warmup=0, active=STEPS, repeat=1),
            on_trace_ready=lambda p: p.export_chrome_trace(path),
        ) as prof:
            for _ in range(STEPS):
                model.zero_grad()
                model(torch.randn(3, 4)).sum().backward()
                dist.all_reduce(torch.ones(ALLREDUCE_N))
                dist.all_reduce(model.bias.grad)
                prof.step()
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def gloo_traces(tmp_path_factory) -> list[str]:
    out = tmp_path_factory.mktemp("gloo")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(_worker, args=(_free_port(), str(out)), nprocs=WORLD, join=True)
    return sorted(str(p) for p in out.glob("rank-*.json.gz"))


def test_distributed_info(gloo_traces):
    assert len(gloo_traces) == WORLD
    for rank, path in enumerate(gloo_traces):
        info = KinetoTraceReader(path).distributed_info
        assert info["backend"] == "gloo"
        assert info["rank"] == rank
        assert info["world_size"] == WORLD


def test_steps_and_collectives(gloo_traces):
    ranks = load_ranks(gloo_traces)
    assert sorted(ranks) == [0, 1]
    for rt in ranks.values():
        assert rt.world_size == WORLD
        assert [s["step"] for s in rt.steps] == list(range(STEPS))
        assert all(s["dur"] > 0 for s in rt.steps)
        assert rt.kernels == []  # CPU-only job: no GPU activity
        colls = [c for c in rt.collectives if c["collective"] == "all_reduce"]
        sizes = sorted(c["in_nelems"] for c in colls)
        assert sizes == sorted([ALLREDUCE_N] * STEPS + [2] * STEPS), sizes
        for c in colls:
            assert c["dtype"] == "float"
            assert c["dur"] > 0
        # gloo runs the op on its own thread; each one starts inside a profiled step
        for c in colls:
            assert any(s["ts"] <= c["ts"] <= s["end"] for s in rt.steps), c
