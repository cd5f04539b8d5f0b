"""The native pipeline engine: torch.distributed.pipelining behind `PipelineRuntime`'s surface.

    gpipe / naive   ScheduleGPipe            1f1b         Schedule1F1B
    interleaved     ScheduleInterleaved1F1B  zero-bubble  ScheduleInterleavedZeroBubble
                                                          (one stage per rank here)
    zbv             ScheduleZBVZeroBubble (v = 2, V placement)
PipelineStage's stage index is our global stage, `schedules.stage_of(rank, chunk, p, v,
placement_of(schedule))`: chunk * p + rank (the loop placement the interleaved schedules expect),
or for zbv stages r and 2p-1-r on rank r (the V placement ScheduleZBVZeroBubble expects; it hands
the activation between stages p-1 and p on rank p-1 over locally, with no send / receive).
The schedules emit no trace of their own (Schedule1F1B has no
profiler annotations), so each PipelineStage's `forward_one_chunk` / `backward_one_chunk` /
`backward_weight_one_chunk` is wrapped in a `compute` span named like our actions (F, BW or B,
W) and its `get_*_send_ops` / `get_*_recv_ops` in `comm` records (axis "pp", peer, micro-batch,
chunk) with the bytes of the tensors PyTorch really sends. Gradients are divided by m by the
schedule (scale_grads); the loss is divided by the accumulation rounds here.
"""

from __future__ import annotations

import functools

import torch
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleZBVZeroBubble,
)

from jobs import schedules
from jobs.memory import SavedTensorCounter, param_storages

SINGLE = {"naive": ScheduleGPipe, "gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}
MULTI = {"interleaved": ScheduleInterleaved1F1B, "zero-bubble": ScheduleInterleavedZeroBubble,
         "zbv": ScheduleZBVZeroBubble}


class NativePipeline:
    def __init__(self, stages: dict, *, schedule: str, p: int, m: int, v: int, rank: int,
                 pp_group, loss_fn, tracer=None, device=None):
        self.m, self.p, self.v, self.rank, self.tracer = m, p, v, rank, tracer
        self.n_stages = p * v
        self.loss_scale = 1.0
        self.peak = {"inflight_microbatches": 0, "activation_bytes": 0}
        self.pstages = []
        place = schedules.placement_of(schedule)
        for chunk in sorted(stages):
            ps = PipelineStage(stages[chunk], schedules.stage_of(rank, chunk, p, v, place),
                               self.n_stages, device or torch.device("cpu"), group=pp_group)
            self._instrument(ps, chunk)
            self.pstages.append(ps)

        def loss(out, target):
            return loss_fn(out, target) * self.loss_scale

        if schedule in SINGLE:
            self.sched = SINGLE[schedule](self.pstages[0], n_microbatches=m, loss_fn=loss)
        else:
            self.sched = MULTI[schedule](self.pstages, n_microbatches=m, loss_fn=loss)
        self.first = any(ps.stage_index == 0 for ps in self.pstages)
        self.last = any(ps.stage_index == self.n_stages - 1 for ps in self.pstages)
        self.live: dict = {}  # (micro-batch, chunk) -> bytes saved for backward

    def _span(self, kind, mb, chunk, stage):
        self.tracer.microbatch = mb
        return self.tracer.span(kind, cat="compute", action=kind, microbatch=mb, chunk=chunk,
                                stage=stage, device=False)

    def _instrument(self, ps, chunk: int) -> None:
        if self.tracer is None:
            return
        s = ps.stage_index

        def fwd(orig, mb, *a, **k):
            saved = SavedTensorCounter(param_storages(ps.submod), skip_leaves=False)
            with self._span("F", mb, chunk, s), saved.hooks():
                out = orig(mb, *a, **k)
            self.live[(mb, chunk)] = saved.bytes
            n, b = len(self.live), sum(self.live.values())
            self.peak["inflight_microbatches"] = max(self.peak["inflight_microbatches"], n)
            self.peak["activation_bytes"] = max(self.peak["activation_bytes"], b)
            self.tracer.memory(activations=b, inflight_microbatches=n)
            return out

        def bwd(orig, mb, *a, **k):
            full = k.get("full_backward", True)
            with self._span("BW" if full else "B", mb, chunk, s):
                out = orig(mb, *a, **k)
            if full:
                self._freed(mb, chunk)
            return out

        def wgt(orig, mb, *a, **k):
            with self._span("W", mb, chunk, s):
                out = orig(mb, *a, **k)
            self._freed(mb, chunk)
            return out

        def ops(orig, op, phase, mb, *a, **k):
            res = orig(mb, *a, **k)
            for o in res:
                t = o.tensor
                self.tracer.comm_start(op, payload_bytes=t.numel() * t.element_size(),
                                       group_size=2, axis="pp", group=f"pp:{op}:{o.peer}",
                                       peer=o.peer, chunk=chunk, phase=phase,
                                       microbatch=mb).done()
            return res

        for name, wrap in (("forward_one_chunk", fwd), ("backward_one_chunk", bwd),
                           ("backward_weight_one_chunk", wgt)):
            setattr(ps, name, functools.partial(wrap, getattr(ps, name)))
        for name, op, phase in (("get_fwd_send_ops", "send", "fwd"),
                                ("get_bwd_send_ops", "send", "bwd"),
                                ("get_fwd_recv_ops", "recv", "fwd"),
                                ("get_bwd_recv_ops", "recv", "bwd")):
            setattr(ps, name, functools.partial(ops, getattr(ps, name), op, phase))

    def _freed(self, mb: int, chunk: int):
        self.live.pop((mb, chunk), None)
        self.tracer.memory(activations=sum(self.live.values()),
                           inflight_microbatches=len(self.live))

    def step(self, microbatches: list) -> float | None:
        x = torch.cat([mb[0] for mb in microbatches])
        y = torch.cat([mb[1] for mb in microbatches])
        losses: list = []
        args = (x,) if self.first else ()
        kw = {"target": y, "losses": losses} if self.last else {}
        self.sched.step(*args, **kw)
        if self.tracer is not None:
            self.tracer.microbatch = None
        if not self.last:
            return None
        return float(sum(float(v) for v in losses)) / self.m
