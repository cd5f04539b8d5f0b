"""Hand-computed oracles for expert routing and its all-to-all (issue 43, "caught only
indirectly"): the router's tie-break against a reference top-k written here (Python sort on a
(-probability, expert) key), and the per-rank send / receive byte matrix of an asymmetric
two-rank dispatch (gloo, two processes) against a table computed by hand."""

from __future__ import annotations

import math
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

from jobs.models import gpt
from jobs.models.moe import MoE

# -- the router's tie-break: lowest expert index wins an exact tie (jobs/models/moe.py)


def reference_route(probs: list[list[float]], k: int, cap: int) -> tuple[list, list]:
    """(kept, dropped) per expert for one capacity group of tokens in order: top-k by
    (-p, e) (ties to the lower index), then every token's first choice before any second
    choice, earlier tokens first, at most `cap` per expert (0: no limit)."""
    e = len(probs[0])
    choices = [sorted(range(e), key=lambda j, p=p: (-p[j], j))[:k] for p in probs]
    kept, dropped = [0] * e, [0] * e
    for level in range(k):
        for ch in choices:
            x = ch[level]
            if cap and kept[x] >= cap:
                dropped[x] += 1
            else:
                kept[x] += 1
    return kept, dropped


@pytest.mark.parametrize("top_k,cf", [(1, 0.0), (2, 0.0), (2, 1.0), (3, 0.75)])
def test_exact_ties_route_like_a_reference_sort(top_k, cf):
    torch.manual_seed(1)
    m = MoE(8, experts=6, top_k=top_k, capacity_factor=cf, aux_loss_coef=0.0, router_bias={},
            shared_expert=False, make_mlp=gpt.MLP)
    with torch.no_grad():  # experts 3, 4, 5 copy 0, 2, 1's router rows: every token has ties
        w = m.router.weight
        w[3], w[4], w[5] = w[0], w[2], w[1]
    x = torch.randn(1, 16, 8)
    probs = (m.router(x) + m.logit_bias).float().softmax(-1)[0]
    p = probs.tolist()
    assert all(p[t][0] == p[t][3] and p[t][1] == p[t][5] for t in range(16))  # exact ties
    cap = math.ceil(cf * 16 * top_k / 6) if cf else 0
    kept, dropped = reference_route(p, top_k, cap)
    r = m.route(x)
    assert r.counts == kept
    assert r.dropped.tolist() == dropped
    assert (r.routed - r.dropped).tolist() == kept
    if top_k == 1:  # a copy never wins against its lower original
        assert kept[3] == 0 and kept[5] == 0 and sum(kept) == 16


# -- the all-to-all's send / receive split: rank 0 sends 1 row to itself and 3 to rank 1,
# rank 1 sends 2 rows to rank 0 and 4 to itself; one expert per rank, hidden 3 (float32: a
# row is 12 bytes). Hand table, bytes:
#               send_bytes   recv_bytes   bytes_sent  bytes_recv
#   rank 0      [12, 36]     [12, 24]         36          24
#   rank 1      [24, 48]     [36, 48]         24          36
# combine is the reverse (send and receive exchanged); the counts all-to-all moves one int64
# per expert each way.
COUNTS = {0: [1, 3], 1: [2, 4]}
ROW = 3 * 4
HAND = {0: {"send": [12, 36], "recv": [12, 24]}, 1: {"send": [24, 48], "recv": [36, 48]}}


class Recorder:
    def __init__(self):
        self.recs: list[dict] = []

    def comm_start(self, op, **kw):
        rec = {"op": op, **kw}
        self.recs.append(rec)
        return type("H", (), {"done": lambda self: None})()


class Scale(nn.Module):
    def __init__(self, f: float):
        super().__init__()
        self.f = f

    def forward(self, x):
        return x * self.f


def _worker(rank: int, store: str, q) -> None:
    from jobs.parallel.expert import EPExperts
    os.environ["OMP_NUM_THREADS"] = "1"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        tr = Recorder()
        ex = EPExperts(nn.ModuleDict({"0": Scale(10.0), "1": Scale(100.0)}), dist.group.WORLD,
                       tr, layer=0)
        n = sum(COUNTS[rank])
        x = (rank * 1000 + torch.arange(n, dtype=torch.float32)).repeat(3, 1).T.contiguous()
        x.requires_grad_(True)
        y = ex(x, COUNTS[rank])
        y.sum().backward()
        q.put((rank, tr.recs, y.detach()[:, 0].tolist(), x.grad[:, 0].tolist()))
    finally:
        dist.destroy_process_group()


def test_dispatch_and_combine_record_what_each_rank_sends_and_receives(tmp_path):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, str(tmp_path / "store"), q)) for r in (0, 1)]
    for p in procs:
        p.start()
    out = {}
    for _ in procs:
        rank, recs, y, g = q.get(timeout=120)
        out[rank] = (recs, y, g)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    for rank, (recs, y, g) in out.items():
        # every row comes back from the expert that holds it: rows for expert 0 x 10,
        # expert 1 x 100 (rows are sorted by expert: the first COUNTS[rank][0] go to 0)
        c0 = COUNTS[rank][0]
        base = [rank * 1000 + i for i in range(sum(COUNTS[rank]))]
        assert y == [v * (10.0 if i < c0 else 100.0) for i, v in enumerate(base)]
        assert g == [10.0 if i < c0 else 100.0 for i in range(len(base))]
        by = {(x["what"], x["phase"]): x for x in recs}
        assert set(by) == {("counts", "fwd"), ("dispatch", "fwd"), ("combine", "fwd"),
                           ("dispatch", "bwd"), ("combine", "bwd")}
        h = HAND[rank]
        for key, (send, recv) in {("dispatch", "fwd"): (h["send"], h["recv"]),
                                  ("combine", "bwd"): (h["send"], h["recv"]),
                                  ("combine", "fwd"): (h["recv"], h["send"]),
                                  ("dispatch", "bwd"): (h["recv"], h["send"])}.items():
            x = by[key]
            assert (x["send_bytes"], x["recv_bytes"]) == (send, recv), (rank, key)
            other = 1 - rank
            assert (x["bytes_sent"], x["bytes_recv"]) == (send[other], recv[other]), (rank, key)
            assert x["payload_bytes"] == sum(send) and x["ep_rank"] == rank
        c = by[("counts", "fwd")]
        assert c["send_bytes"] == c["recv_bytes"] == [8, 8] and c["bytes_sent"] == 8.0
