"""The reference engines' optimizer (jobs/parallel/optim.py) against torch's own classes: the
same parameters and state, bit for bit, after every step; and a job that steps it never imports
torch._dynamo (the reason it exists)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from jobs.parallel import optim
from jobs.parallel.optim import EagerOptimizer

SHAPES = [(7, 5), (5,), (3, 2, 4)]
# a parameter the CPU update cuts into chunks (optim.CPU_CHUNK_BYTES: 65,536 fp32 elements),
# the last one short, beside small ones
LARGE = [(7, 5), (3 * 65_536 + 17,), (3, 2, 4)]


def _pair(name: str, lr: float, seed: int = 0, shapes=SHAPES):
    g = torch.Generator().manual_seed(seed)
    base = [torch.randn(s, generator=g) for s in shapes]
    ours = [torch.nn.Parameter(t.clone()) for t in base]
    theirs = [torch.nn.Parameter(t.clone()) for t in base]
    cls = {"adam": torch.optim.Adam, "sgd": torch.optim.SGD}[name]
    return ours, EagerOptimizer(ours, name, lr), theirs, cls(theirs, lr=lr), g


@pytest.mark.parametrize("shapes", [SHAPES, LARGE], ids=["small", "chunked"])
@pytest.mark.parametrize("name,lr", [("adam", 1e-3), ("adam", 0.3), ("sgd", 0.1), ("sgd", 2.0)])
def test_each_step_equals_torchs_class_bit_for_bit(name, lr, shapes):
    assert torch.Size(LARGE[1]).numel() * 4 > 3 * optim.CPU_CHUNK_BYTES  # it is cut in 4
    ours, opt, theirs, ref, g = _pair(name, lr, shapes=shapes)
    for step in range(5):
        grads = [torch.randn(s, generator=g) * (10 ** step) for s in shapes]
        for p, q, gr in zip(ours, theirs, grads, strict=True):
            p.grad, q.grad = gr.clone(), gr.clone()
        if step == 2:  # a parameter without a gradient this step is left alone by both
            ours[1].grad = theirs[1].grad = None
        opt.step()
        ref.step()
        for p, q in zip(ours, theirs, strict=True):
            assert torch.equal(p, q), (name, lr, step)
        for p, q in zip(ours, theirs, strict=True):
            mine, torchs = opt.state.get(p, {}), ref.state.get(q, {})
            assert mine.keys() == torchs.keys(), (mine.keys(), torchs.keys())
            for k in mine:
                assert mine[k].dtype == torchs[k].dtype and torch.equal(mine[k], torchs[k]), k


def test_state_set_from_a_checkpoint_continues_as_torchs_class():
    """jobs/ckpt_state.py writes torch's layout into `state` on resume: the next steps go on
    from it exactly as torch's class given the same state."""
    ours, opt, theirs, ref, g = _pair("adam", 1e-2, seed=3)
    for p, q in zip(ours, theirs, strict=True):
        m, v = torch.randn(p.shape, generator=g), torch.rand(p.shape, generator=g)
        opt.state[p] = {"step": torch.tensor(7.0), "exp_avg": m.clone(), "exp_avg_sq": v.clone()}
        ref.state[q] = {"step": torch.tensor(7.0), "exp_avg": m.clone(), "exp_avg_sq": v.clone()}
    for _ in range(2):
        for p, q in zip(ours, theirs, strict=True):
            gr = torch.randn(p.shape, generator=g)
            p.grad, q.grad = gr.clone(), gr.clone()
        opt.step()
        ref.step()
    assert all(torch.equal(p, q) for p, q in zip(ours, theirs, strict=True))
    assert float(opt.state[ours[0]]["step"]) == 9.0


def test_a_reference_job_never_imports_the_compiler():
    """What a rank of a reference-engine run imports and steps, in a fresh interpreter:
    torch._dynamo, DTensor and DCP stay out (each costs a rank CPU seconds at startup)."""
    code = (
        "import sys, torch, jobs.train\n"
        "from jobs.parallel.base import FlatOptimizer\n"
        "for name in ('adam', 'sgd'):\n"
        "    fo = FlatOptimizer([torch.zeros(4)], 0.1, name)\n"
        "    fo.step([torch.ones(4)])\n"
        "bad = [m for m in ('torch._dynamo', 'torch.distributed.tensor',\n"
        "                   'torch.distributed.checkpoint', 'torch.distributed.pipelining')\n"
        "       if m in sys.modules]\n"
        "print(bad)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]", out
