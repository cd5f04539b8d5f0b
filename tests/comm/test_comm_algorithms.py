"""The point-to-point all-reduce algorithms' message patterns, on PyTorch's fake process group.

The fake backend lets one process play any rank of any world size: sends and receives complete
without moving data, so this checks who sends what to whom in which step (seed 000's table) for
world sizes the real multi-rank tests do not launch, plus the errors. One subprocess runs it all
so no process group leaks into the test process. Results and real traffic are checked on gloo in
test_comm_sweeps.py.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from _commtable import ROOT, assert_seed_table, torchrun

SCRIPT = r"""
import contextlib, json, sys
import torch, torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
from jobs.comm import allreduce

class Rec:
    def __init__(self):
        self.recs = []
    @contextlib.contextmanager
    def comm(self, op, *, payload_bytes, group_size, axis="dp", group=None, peer=None,
             is_root=False, **args):
        self.recs.append({"op": op, "peer": peer, "payload_bytes": payload_bytes,
                          "group_size": group_size, "axis": axis, "group": group, **args})
        yield

def run(world, name, placement, numel):
    out = {}
    for rank in range(world):
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
        try:
            t, tr = torch.ones(numel), Rec()
            allreduce.get_algorithm(name, ps_placement=placement)(t, tracer=tr)
            out[rank] = tr.recs
        finally:
            dist.destroy_process_group()
    return out

def error(world, name, placement):
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        allreduce.get_algorithm(name, ps_placement=placement)(torch.ones(8))
        return None
    except ValueError as e:
        return str(e)
    finally:
        dist.destroy_process_group()

cases = json.loads(sys.argv[1])
res = {"runs": [run(*c) for c in cases["runs"]], "errors": [error(*c) for c in cases["errors"]]}
print("RESULT" + json.dumps(res))
"""

NUMEL = 840  # divisible by 2..8: the ring's chunks are all equal
RUNS = ([(w, a, "dedicated", NUMEL) for w in (2, 3, 5, 8) for a in ("naive", "ring", "tree")]
        + [(w, "butterfly", "dedicated", NUMEL) for w in (2, 8, 16)]
        + [(w, "ps", p, NUMEL) for w in (3, 5, 8) for p in ("dedicated", "rank0")]
        + [(2, "ps", "rank0", NUMEL), (8, "ring", "dedicated", 5)])
ERRORS = [(3, "butterfly", "dedicated"), (6, "butterfly", "dedicated"),
          (2, "ps", "dedicated"), (4, "ps", "nowhere")]


@pytest.fixture(scope="module")
def fake_runs():
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps({"runs": RUNS, "errors": ERRORS})],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT"))
    res = json.loads(line.removeprefix("RESULT"))
    runs = {tuple(c[:3]) + (c[3],): {int(k): v for k, v in r.items()}
            for c, r in zip(RUNS, res["runs"], strict=True)}
    return runs, res["errors"]


@pytest.mark.parametrize("case", [c for c in RUNS if c[3] == NUMEL], ids=str)
def test_seed_table_from_records(fake_runs, case):
    world, name, placement, numel = case
    recs = fake_runs[0][case]
    assert_seed_table(recs, name, world, numel * 4, placement)
    for rank_recs in recs.values():
        for r in rank_recs:
            assert r["group_size"] == 2 and r["axis"] == "pg:world"
            assert r["group"].startswith("pg:world:p2p:")
            assert (r.get("placement") == placement) == (name == "ps")


def test_ring_tiny_tensor_skips_empty_chunks(fake_runs):
    recs = fake_runs[0][(8, "ring", "dedicated", 5)]
    sent = sum(r["payload_bytes"] for rs in recs.values() for r in rs if r["op"] == "send")
    assert sent == 2 * 7 * 5 * 4  # still 2(N-1)M in total


def test_errors(fake_runs):
    errors = fake_runs[1]
    assert "power-of-two" in errors[0] and "got 3" in errors[0]
    assert "power-of-two" in errors[1] and "got 6" in errors[1]
    assert "dedicated parameter server needs >= 3 ranks" in errors[2]
    assert "placement" in errors[3]


GLOO_SCRIPT = r"""
import contextlib, sys
import torch, torch.distributed as dist
from jobs.comm import allreduce

class Null:
    @contextlib.contextmanager
    def comm(self, op, **kw):
        yield
    @contextlib.contextmanager
    def span(self, name, cat="compute", **kw):
        yield

dist.init_process_group("gloo")
r = dist.get_rank()
n = dist.get_world_size()
bad = []
def check(name, x, tracer=None, **kw):
    ref = x.clone()
    dist.all_reduce(ref)
    fn = allreduce.get_algorithm(name, **kw)
    fn(x, tracer=tracer)
    if not torch.equal(x, ref):
        bad.append((name, tuple(x.shape), kw, tracer is not None, allreduce.RING_SEGMENT_BYTES))

for seg in (4, 64, 4096):  # many segments per chunk: the pipelined ring's forwarding
    allreduce.RING_SEGMENT_BYTES = seg
    for numel in (1, 2, 7, 1000, 12289):
        if seg == 4 and numel > 1000:
            continue
        for traced in (None, Null()):
            x = (torch.arange(numel, dtype=torch.float32) * 7 + r * 3) % 11 + 1
            check("ring", x, traced)
for name, kw in [("naive", {}), ("tree", {}), ("ring", {}), ("ps", {"ps_placement": "rank0"}),
                 ("ps", {"ps_placement": "dedicated"})]:
    for dtype in (torch.float32, torch.bfloat16, torch.int32):
        x = ((torch.arange(60) * 7 + r * 3) % 11 + 1).to(dtype).view(6, 10).t()  # not contiguous
        if name == "ps" and kw["ps_placement"] == "dedicated" and r == n - 1:
            x.zero_()
        check(name, x, **kw)
        assert x.stride() == (1, 10)
print("BAD", bad, flush=True)
dist.destroy_process_group()
sys.exit(1 if bad else 0)
"""


def test_on_gloo_segments_layouts_and_dtypes(tmp_path):
    """Real data on 3 gloo ranks: the pipelined ring with many segments per chunk (traced and
    untraced), and every algorithm on non-contiguous bf16 / int32 / fp32 tensors."""
    script = tmp_path / "worker.py"
    script.write_text(GLOO_SCRIPT)
    proc = torchrun(3, [str(script)], timeout=180, inherit=False)
    # each rank exits 1 when one of its results differs from the backend's all-reduce; the
    # ranks' lines may interleave on the shared stdout, so only count them
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert proc.stdout.count("BAD") == 3 and "BAD [(" not in proc.stdout
