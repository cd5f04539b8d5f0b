"""Context parallelism's ring exchange (ring attention, Liu et al. 2023), traced.

`Ring.start(tensors, ...)` posts, for every named tensor, an `isend` to the next rank of the CP
ring and an `irecv` of a same-shaped buffer from the previous one, and returns at once, so the
caller computes the current block's attention while the next block travels; `Ring.wait` blocks
until the received tensors are there. Each transfer is one `comm` record with axis "cp",
opened when posted and closed when waited (its duration spans the overlap):

    op               "send" (to `peer` = next rank) / "recv" (from `peer` = previous rank)
    payload_bytes    the tensor's bytes (send: bytes_sent = payload; recv: bytes_recv = payload)
    what             "k" / "v" (forward and backward) or "dk" / "dv" (backward)
    phase            "fwd" / "bwd"; cp_step: the ring step; layer: the block's index
    cp_rank          this rank's index in the CP group
"""

from __future__ import annotations

import torch
import torch.distributed as dist

TAGS = {"k": 0, "v": 1, "dk": 2, "dv": 3}  # one tag per kind: several are in flight at once


class Ring:
    def __init__(self, group, ranks: list[int], rank: int, tracer):
        self.group, self.ranks, self.tracer = group, list(ranks), tracer
        self.cp = len(ranks)
        self.index = self.ranks.index(rank)
        self.next = self.ranks[(self.index + 1) % self.cp]
        self.prev = self.ranks[(self.index - 1) % self.cp]

    def _rec(self, op: str, t: torch.Tensor, peer: int, **args):
        return self.tracer.comm_start(op, payload_bytes=t.numel() * t.element_size(),
                                      group_size=2, axis="cp", group=f"cp:{op}:{peer}",
                                      peer=peer, cp_rank=self.index,
                                      dtype=str(t.dtype).removeprefix("torch."), **args)

    def start(self, tensors: dict, *, cp_step: int, phase: str, layer: int) -> list:
        """Send every tensor to the next rank, receive its counterpart from the previous one."""
        posted = []
        for what, t in tensors.items():
            t = t.detach().contiguous()
            buf = torch.empty_like(t)
            meta = {"what": what, "phase": phase, "cp_step": cp_step, "layer": layer}
            hs = self._rec("send", t, self.next, **meta)
            hr = self._rec("recv", buf, self.prev, **meta)
            # the receive first: with cp = 2 next and prev are the same peer
            rw = dist.irecv(buf, self.prev, group=self.group, tag=TAGS[what])
            sw = dist.isend(t, self.next, group=self.group, tag=TAGS[what])
            posted.append((what, t, buf, sw, rw, hs, hr))
        return posted

    def wait(self, posted: list) -> dict:
        out = {}
        for what, _t, buf, sw, rw, hs, hr in posted:
            rw.wait()
            hr.done()
            sw.wait()
            hs.done()
            out[what] = buf
        return out
