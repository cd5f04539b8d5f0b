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
W); the peak in-flight count and bytes are kept in `peak` and traced as memory samples.

Receive buffers (issue 38 item 4; docs/conventions.md "Pipeline receive buffers"): the remote
receives of the rank's action list, in action order, form two queues, activations (F inputs)
and output gradients (BW / B). Each queue keeps one receive posted ahead: its first at the
start of the step, the next right after the previous one's wait (Megatron's overlapped p2p
posts the next micro-batch's receive the same way). A buffer, allocated in the run's dtype
(`dtype`, default the stages' parameter dtype), is live from its post until it is released:
an activation at its wait (it is then the stage input, counted as an activation), a gradient
at the end of its BW, or at its W after a B (kept for the weight pass). `peak
["recv_buffer_bytes"]` is the most bytes of live receive buffers at once (measured on the
buffers themselves); jobs/theory/ranks.py predicts it with the same rule.
"""

from __future__ import annotations

import contextlib

import torch

from jobs import schedules
from jobs.memory import SavedTensorCounter, param_storages
from jobs.parallel.pipeline.p2p import ACT, GRAD, P2P, tag


class PipelineRuntime:
    def __init__(self, stages: dict, *, schedule: str, p: int, m: int, v: int, rank: int,
                 pp_ranks: list[int], loss_fn, act_shape, dtype=None, tracer=None,
                 device=None):
        self.stages, self.schedule, self.p, self.m, self.v = stages, schedule, p, m, v
        self.rank, self.pp_ranks, self.loss_fn = rank, pp_ranks, loss_fn
        self.act_shape, self.tracer, self.device = act_shape, tracer, device
        self.dtype = dtype or _training_dtype(stages)
        self.n_stages = p * v
        self.actions = schedules.schedule_actions(schedule, p, m, v)[rank]
        place = schedules.placement_of(schedule)
        self.home = [schedules.rank_of(s, p, v, place) for s in range(self.n_stages)]
        self.p2p = P2P(tracer)
        self.recv_queue = self._receives()
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
            # in the receive buffers' dtype (a no-op when the stage computes in it)
            self.p2p.send(t.to(self.dtype), self._peer(dst_stage),
                          tag(kind, mb, dst_stage, self.n_stages), mb=mb, chunk=chunk,
                          phase=phase)

    def _take(self, kind: int, mb: int, stage: int, src_stage: int, *, chunk: int, phase: str):
        if self._is_local(src_stage):
            return self.local.pop((kind, mb, stage))
        key = (kind, mb, stage)
        assert key in self.posted, f"receive {key} consumed out of its queue's order"
        buf = self.p2p.wait(self.posted.pop(key), mb=mb, chunk=chunk, phase=phase)
        if kind == ACT:
            self._release(key)  # from here on the stage input: an activation
        self._post_next(kind)
        return buf

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
            self._release((GRAD, a.mb, s))
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
        self._release((GRAD, a.mb, a.stage))
        self._free(a)

    def _free(self, a):
        self.live.pop((a.mb, a.chunk))
        self.act_bytes.pop((a.mb, a.chunk))
        self._mem()

    def _receives(self) -> dict[int, list]:
        """The remote receives of this rank's actions, per kind (ACT: F inputs, GRAD: BW / B
        output gradients), in the order the actions consume them: ((kind, mb, stage), src)."""
        queue: dict[int, list] = {ACT: [], GRAD: []}
        for a in self.actions:
            s = a.stage
            if a.kind == "F" and s != 0:
                kind, src_stage = ACT, s - 1
            elif a.kind in ("BW", "B") and s != self.n_stages - 1:
                kind, src_stage = GRAD, s + 1
            else:
                continue
            if not self._is_local(src_stage):  # else handed over in memory by this rank
                queue[kind].append(((kind, a.mb, s), self._peer(src_stage)))
        return queue

    def _post_next(self, kind: int) -> None:
        """irecv the next receive of `kind`'s queue (one posted ahead per kind)."""
        i = self.recv_next[kind]
        if i == len(self.recv_queue[kind]):
            return
        self.recv_next[kind] = i + 1
        key, src = self.recv_queue[kind][i]
        self.posted[key] = posted = self.p2p.post(
            self.act_shape, self.dtype, src, tag(kind, key[1], key[2], self.n_stages),
            self.device)
        buf = posted[1]
        self.recv_live[key] = buf.numel() * buf.element_size()
        self.peak["recv_buffer_bytes"] = max(self.peak["recv_buffer_bytes"],
                                             sum(self.recv_live.values()))

    def _release(self, key) -> None:
        self.recv_live.pop(key, None)  # absent: handed over locally, or the last stage's

    def step(self, microbatches: list) -> float | None:
        """One pipelined forward/backward over `m` micro-batches; gradients accumulate into
        the stages' parameters (scaled by `loss_scale`, 1/m by default). Returns the summed
        scaled loss on the last stage's ranks, None elsewhere."""
        if len(microbatches) != self.m:
            raise ValueError(f"expected {self.m} micro-batches, got {len(microbatches)}")
        self.live, self.act_bytes, self.grad_out, self.losses = {}, {}, {}, []
        self.local: dict = {}  # (kind, mb, stage) -> tensor from a stage on this rank
        self.posted, self.recv_live, self.recv_next = {}, {}, {ACT: 0, GRAD: 0}
        self._post_next(ACT)
        self._post_next(GRAD)
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
        assert not self.posted and not self.recv_live, "receive buffers left after the step"
        if self.tracer is not None:
            self.tracer.microbatch = None
        return float(sum(self.losses)) if self.losses else None


def _training_dtype(stages: dict) -> torch.dtype:
    """The dtype activations and gradients cross stage boundaries in: the stages' floating
    parameters' (float32 when they have none)."""
    for st in stages.values():
        for q in st.parameters():
            if q.is_floating_point():
                return q.dtype
    return torch.float32
