"""Traced point-to-point transfers between pipeline stages.

Sends are asynchronous (isend; waited at the end of the step). Receives are posted ahead
(`post`: the runtime keeps one receive per kind posted ahead of the action that needs it, see
runtime.py) so the data can arrive while the rank computes; `wait` blocks until the data is
there, so that wait shows in the trace as idle time between compute spans (the `recv` record
spans the wait). Messages are matched by tag (kind, micro-batch, stage), so the order in which
a pair's messages are posted does not matter on gloo. Every transfer is a `comm` record with
axis "pp", the peer, the micro-batch and the chunk; its payload is the tensor's bytes.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

ACT, GRAD = 0, 1


def tag(kind: int, mb: int, stage: int, n_stages: int) -> int:
    return (mb * n_stages + stage) * 2 + kind


class P2P:
    def __init__(self, tracer=None):
        self.tracer = tracer
        self.pending: list = []

    def _rec(self, op, t, peer, mb, chunk, phase):
        if self.tracer is None:
            return None
        return self.tracer.comm_start(op, payload_bytes=t.numel() * t.element_size(),
                                      group_size=2, axis="pp", group=f"pp:{op}:{peer}",
                                      peer=peer, chunk=chunk, phase=phase, microbatch=mb)

    def send(self, t: torch.Tensor, dst: int, tg: int, *, mb: int, chunk: int, phase: str):
        t = t.detach().contiguous()
        h = self._rec("send", t, dst, mb, chunk, phase)
        self.pending.append((dist.isend(t, dst, tag=tg), t))
        if h is not None:
            h.done()

    def post(self, shape, dtype, src: int, tg: int, device=None):
        buf = torch.empty(shape, dtype=dtype, device=device)
        return dist.irecv(buf, src, tag=tg), buf, src

    def wait(self, posted, *, mb: int, chunk: int, phase: str) -> torch.Tensor:
        work, buf, src = posted
        h = self._rec("recv", buf, src, mb, chunk, phase)
        work.wait()
        if h is not None:
            h.done()
        return buf

    def wait_all(self) -> None:
        for work, _ in self.pending:
            work.wait()
        self.pending.clear()
