"""Expert parallelism's all-to-all (seed 004: "all-to-all dispatch / combine"), traced.

`all_to_all(x, out_splits, in_splits, group, ...)` is `torch.distributed.all_to_all_single` with
uneven per-rank row counts as an autograd function: its backward is the reverse all-to-all
(splits swapped) of the output gradient. Every call is one comm record with axis "ep":

    op               "all_to_all"
    payload_bytes    S = this rank's whole send buffer (nccl-tests: the logical input),
                     self-destined rows included
    send_bytes       [bytes to group rank d for d in range(ep)] (entry `ep_rank` stays local)
    recv_bytes       [bytes from group rank s for s in range(ep)]
    bytes_sent/recv  what crossed the wire: the sums without the self entry (exact for uneven
                     splits, where the even-split factor (n-1)/n * S of jobs.commbytes is not)
    what             "dispatch" / "combine" (token rows) or "counts" (per-expert row counts)
    phase            "fwd" / "bwd"; layer: the MoE block's index
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def traced_all_to_all(out: torch.Tensor, inp: torch.Tensor, out_splits: list, in_splits: list,
                      group, tracer, *, what: str, phase: str, layer: int) -> None:
    """One `all_to_all_single` inside a comm record with per-destination byte counts."""
    n, me = dist.get_world_size(group), dist.get_rank(group)
    row = inp[0].numel() * inp.element_size() if inp.dim() > 1 else inp.element_size()
    send = [c * row for c in in_splits]
    recv = [c * row for c in out_splits]
    h = tracer.comm_start("all_to_all", payload_bytes=sum(send), group_size=n, axis="ep",
                          group="ep", what=what, phase=phase, layer=layer,
                          dtype=str(inp.dtype).removeprefix("torch."), ep_rank=me,
                          send_bytes=send, recv_bytes=recv,
                          # exact wire bytes of uneven splits: these keys override the
                          # even-split figures comm_start derives from the payload
                          bytes_sent=float(sum(send) - send[me]),
                          bytes_recv=float(sum(recv) - recv[me]))
    dist.all_to_all_single(out, inp, output_split_sizes=list(out_splits),
                           input_split_sizes=list(in_splits), group=group)
    h.done()


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group, tracer, what, layer):
        ctx.meta = (out_splits, in_splits, group, tracer, what, layer)
        x = x.contiguous()
        out = x.new_empty((sum(out_splits), *x.shape[1:]))
        traced_all_to_all(out, x, out_splits, in_splits, group, tracer, what=what, phase="fwd",
                          layer=layer)
        return out

    @staticmethod
    def backward(ctx, g):
        out_splits, in_splits, group, tracer, what, layer = ctx.meta
        g = g.contiguous()
        gin = g.new_empty((sum(in_splits), *g.shape[1:]))
        traced_all_to_all(gin, g, in_splits, out_splits, group, tracer, what=what, phase="bwd",
                          layer=layer)
        return gin, None, None, None, None, None, None


def all_to_all(x: torch.Tensor, out_splits: list, in_splits: list, group, tracer, *,
               what: str, layer: int) -> torch.Tensor:
    """Rows `x` split by `in_splits` (one count per group rank) sent out; the rows received,
    `out_splits[s]` from rank s, concatenated in rank order. Differentiable."""
    return _AllToAll.apply(x, list(out_splits), list(in_splits), group, tracer, what, layer)


def exchange_counts(counts: list, group, tracer, *, layer: int, device=None) -> list:
    """Per-expert row counts, len E (experts in rank-major blocks of E/ep): returns
    `recv[s][j]` = rows rank s sends to this rank's local expert j."""
    n = dist.get_world_size(group)
    local = len(counts) // n
    inp = torch.tensor(counts, dtype=torch.int64, device=device)
    out = torch.empty_like(inp)
    traced_all_to_all(out, inp, [local] * n, [local] * n, group, tracer, what="counts",
                      phase="fwd", layer=layer)
    flat = out.tolist()
    return [flat[s * local:(s + 1) * local] for s in range(n)]
