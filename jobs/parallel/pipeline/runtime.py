"""Reference pipeline runtime: executes the per-rank action lists of jobs/schedules.py.

`PipelineRuntime.step(microbatches)` runs this rank's actions in order:
    F   wait for the activation (unless stage 0), forward, send it on (or take the loss / m)
    BW  receive the output gradient (unless last stage), full backward, send the input gradient
    B   input-gradient backward only (zero-bubble), send it; weight gradients wait for W
    W   the weight-gradient work of that micro-batch
So the measured timeline and `schedules.simulate` have the same order by construction and differ
only by real timing. Each action is a `compute` span named after the action (args: action,
microbatch, chunk, stage); sends and receives are `comm` records with axis "pp".

Placement: stage s runs on pipeline rank `schedules.rank_of(s, p, v, placement_of(schedule))`
(loop: s mod p; zbv's V: rank r holds stages r and 2p-1-r). Where neighbouring stages share a
rank (V: stages p-1 and p on rank p-1) the activation / gradient is handed over locally (a copy,
as a receive would give): no send, no receive, no p2p record.

B / W split: layers with a `backward_weight(key)` method (jobs/models/timed.py) defer their
weight-gradient work exactly; other stages run an input-only autograd pass in B
(`inputs=[stage input]`, graph kept) and a parameter-only pass in W, which recomputes the chain
of input gradients (correct, but W then costs about a full backward).

Activation memory: bytes saved for backward (jobs.memory.SavedTensorCounter: parameters
excluded, each storage range once) are counted per (micro-batch, chunk) from F until its BW (or
W); the peak in-flight count and bytes are kept in `peak` and traced as memory samples, with
the bytes of the receive buffers posted at the start of a step (`recv_buffer_bytes`).
"""

from __future__ import annotations

import contextlib

import torch

from jobs import schedules
from jobs.memory import SavedTensorCounter, param_storages
from jobs.parallel.pipeline.p2p import ACT, GRAD, P2P, tag


class PipelineRuntime:
    def __init__(self, stages: dict, *, schedule: str, p: int, m: int, v: int, rank: int,
                 pp_ranks: list[int], loss_fn, act_shape, dtype=torch.float32, tracer=None,
                 device=None):
        self.stages, self.schedule, self.p, self.m, self.v = stages, schedule, p, m, v
        self.rank, self.pp_ranks, self.loss_fn = rank, pp_ranks, loss_fn
        self.act_shape, self.dtype, self.tracer, self.device = act_shape, dtype, tracer, device
        self.n_stages = p * v
        self.actions = schedules.schedule_actions(schedule, p, m, v)[rank]
        place = schedules.placement_of(schedule)
        self.home = [schedules.rank_of(s, p, v, place) for s in range(self.n_stages)]
        self.p2p = P2P(tracer)
        self.peak = {"inflight_microbatches": 0, "activation_bytes": 0, "recv_buffer_bytes": 0}
        self.params_seen = set().union(*(param_storages(st) for st in stages.values()))
        self.loss_scale = 1.0 / m  # the caller divides further for gradient accumulation
        for st in stages.values():
            st._deferred = [mod for mod in st.modules() if hasattr(mod, "backward_weight")]

    # --- helpers ---------------------------------------------------------------------------
    def _peer(self, stage: int) -> int:
        return self.pp_ranks[self.home[stage]]

    def _is_local(self, stage: int) -> bool:
        return self.home[stage] == self.rank

    def _hand_over(self, t, kind: int, mb: int, dst_stage: int, *, chunk: int,
                   phase: str) -> None:
        """Send `t` to `dst_stage` (message keyed by (kind, mb, dst_stage)), or keep it here
        when that stage is on this rank."""
        if self._is_local(dst_stage):
            self.local[(kind, mb, dst_stage)] = t.detach().clone()
        else:
            self.p2p.send(t, self._peer(dst_stage), tag(kind, mb, dst_stage, self.n_stages),
                          mb=mb, chunk=chunk, phase=phase)

    def _take(self, kind: int, mb: int, stage: int, src_stage: int, *, chunk: int, phase: str):
        if self._is_local(src_stage):
            return self.local.pop((kind, mb, stage))
        return self.p2p.wait(self.posted.pop((kind, mb, stage)), mb=mb, chunk=chunk, phase=phase)

    def _span(self, a):
        if self.tracer is None:
            return contextlib.nullcontext()
        self.tracer.microbatch = a.mb
        return self.tracer.span(a.kind, cat="compute", action=a.kind, microbatch=a.mb,
                                chunk=a.chunk, stage=a.stage, device=False)

    def _mem(self):
        n = len(self.live)
        b = sum(self.act_bytes.values())
        self.peak["inflight_microbatches"] = max(self.peak["inflight_microbatches"], n)
        self.peak["activation_bytes"] = max(self.peak["activation_bytes"], b)
        if self.tracer is not None:
            self.tracer.memory(activations=b, inflight_microbatches=n)

    # --- actions ---------------------------------------------------------------------------
    def _forward(self, a, microbatches):
        s, st = a.stage, self.stages[a.chunk]
        if s == 0:
            x = microbatches[a.mb][0]
        else:
            x = self._take(ACT, a.mb, s, s - 1, chunk=a.chunk, phase="fwd").requires_grad_(True)
        saved = SavedTensorCounter(self.params_seen)
        if s != 0:
            saved.allow(x)  # the received input is saved by the first layer: an activation
        with self._span(a), saved.hooks():
            y = st(x)
            if s == self.n_stages - 1:
                y = self.loss_fn(y, microbatches[a.mb][1]) * self.loss_scale
                self.losses.append(y.detach())
        if s != self.n_stages - 1:
            self._hand_over(y, ACT, a.mb, s + 1, chunk=a.chunk, phase="fwd")
        self.live[(a.mb, a.chunk)] = (x, y)
        self.act_bytes[(a.mb, a.chunk)] = saved.bytes
        self._mem()

    def _backward(self, a, split: bool):
        s, st = a.stage, self.stages[a.chunk]
        x, y = self.live[(a.mb, a.chunk)]
        g = None
        if s != self.n_stages - 1:
            g = self._take(GRAD, a.mb, s, s + 1, chunk=a.chunk, phase="bwd")
        with self._span(a):
            if not split:
                torch.autograd.backward(y, g)
            elif st._deferred:
                for mod in st._deferred:
                    mod.defer_weight_grad, mod.wgrad_key = True, (a.mb, a.chunk)
                torch.autograd.backward(y, g)
                for mod in st._deferred:
                    mod.defer_weight_grad = False
            elif x.requires_grad:
                torch.autograd.backward(y, g, inputs=[x], retain_graph=True)
        if split:
            self.grad_out[(a.mb, a.chunk)] = g
        if s != 0:
            self._hand_over(x.grad, GRAD, a.mb, s - 1, chunk=a.chunk, phase="bwd")
        if not split:
            self._free(a)

    def _weight(self, a):
        st = self.stages[a.chunk]
        g = self.grad_out.pop((a.mb, a.chunk))
        with self._span(a):
            if st._deferred:
                for mod in st._deferred:
                    mod.backward_weight((a.mb, a.chunk))
            else:
                _, y = self.live[(a.mb, a.chunk)]
                params = [q for q in st.parameters() if q.requires_grad]
                torch.autograd.backward(y, g, inputs=params)
        self._free(a)

    def _free(self, a):
        self.live.pop((a.mb, a.chunk))
        self.act_bytes.pop((a.mb, a.chunk))
        self._mem()

    def _post_receives(self) -> dict:
        """irecv every activation / gradient this rank's actions will consume this step."""
        posted = {}
        for a in self.actions:
            s = a.stage
            if a.kind == "F" and s != 0:
                key, src_stage = (ACT, a.mb, s), s - 1
            elif a.kind in ("BW", "B") and s != self.n_stages - 1:
                key, src_stage = (GRAD, a.mb, s), s + 1
            else:
                continue
            if self._is_local(src_stage):
                continue  # handed over in memory by this rank's own earlier action
            src = self._peer(src_stage)
            posted[key] = self.p2p.post(self.act_shape, self.dtype, src,
                                        tag(key[0], a.mb, s, self.n_stages), self.device)
        return posted

    def step(self, microbatches: list) -> float | None:
        """One pipelined forward/backward over `m` micro-batches; gradients accumulate into
        the stages' parameters (scaled by `loss_scale`, 1/m by default). Returns the summed
        scaled loss on the last stage's ranks, None elsewhere."""
        if len(microbatches) != self.m:
            raise ValueError(f"expected {self.m} micro-batches, got {len(microbatches)}")
        self.live, self.act_bytes, self.grad_out, self.losses = {}, {}, {}, []
        self.local: dict = {}  # (kind, mb, stage) -> tensor from a stage on this rank
        self.posted = self._post_receives()
        # every receive is posted up front: its buffers are all allocated before the first
        # action (once consumed, an activation buffer is the stage input counted above)
        recv = sum(buf.numel() * buf.element_size() for _, buf, _ in self.posted.values())
        self.peak["recv_buffer_bytes"] = max(self.peak["recv_buffer_bytes"], recv)
        for a in self.actions:
            if a.kind == "F":
                self._forward(a, microbatches)
            elif a.kind in ("BW", "B"):
                self._backward(a, split=a.kind == "B")
            elif a.kind == "W":
                self._weight(a)
            else:
                raise ValueError(f"unknown action {a!r}")
        self.p2p.wait_all()
        if self.tracer is not None:
            self.tracer.microbatch = None
        return float(sum(self.losses)) if self.losses else None
