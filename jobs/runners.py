"""How one step's micro-batches go through the composed model (jobs/compose.py picks one):

    DirectRunner    no model parallelism: each accumulation round through the strategy's
                    forward and backward, gradient sync on the last round only (`no_sync`)
    PipelineRunner  tp and / or pp > 1: `grad_accum` pipeline rounds of `microbatches`
                    micro-batches through the pipeline runtime (pp = 1: one stage), then the
                    sequence-parallel gradient sum over tp

Both expose `run(microbatches, sample) -> loss` (the step's mean loss; None on a pipeline rank
without the last stage), `memory()` (figures for the after-step memory sample) and `result()`
(extra per-rank result fields). The loop (jobs/loop.py) does everything else."""

from __future__ import annotations

import contextlib

import torch

from jobs.memory import SavedTensorCounter, param_storages, param_storages_of
from jobs.models import layer_list
from jobs.parallel.tensor import allreduce_sequence_parallel_grads
from jobs.testbug import mb_divisor


def model_layers(strategy):
    m = strategy.model
    for _ in range(3):  # unwrap DDP (.module) / ZeRO-3 root (.inner)
        if layer_list(m) is not None:
            return layer_list(m)
        m = getattr(m, "module", None) or getattr(m, "inner", None)
        if m is None:
            break
    return None


class LayerSpans:
    """Per-layer spans from module hooks (cheap): `forward.layer` around each repeated layer's
    forward, and `backward.layer` from the moment the gradient of its output arrives until
    the gradient of the next-lower layer's output does (or backward ends). They show where
    ZeRO-3 / FSDP2 gathers and DDP bucket launches sit inside forward and backward."""

    def __init__(self, tr, layers):
        self.tr, self.open = tr, None
        for i, layer in enumerate(layers or []):
            layer.register_forward_pre_hook(lambda m, a, i=i: self._fwd_start(m, i))
            layer.register_forward_hook(lambda m, a, out, i=i: self._fwd_end(m, out, i))

    def _fwd_start(self, m, i) -> None:
        m._trace_span = self.tr.span("forward.layer", layer=i)
        m._trace_span.__enter__()

    def _fwd_end(self, m, out, i) -> None:
        span = getattr(m, "_trace_span", None)
        if span is not None:
            m._trace_span = None
            span.__exit__(None, None, None)
        if isinstance(out, torch.Tensor) and out.requires_grad and torch.is_grad_enabled():
            out.register_hook(lambda g, i=i: self._bwd_layer(i))

    def _bwd_layer(self, i) -> None:
        self.end_backward()
        self.open = self.tr.span("backward.layer", layer=i)
        self.open.__enter__()

    def end_backward(self) -> None:
        if self.open is not None:
            span, self.open = self.open, None
            span.__exit__(None, None, None)


class DirectRunner:
    def __init__(self, strategy, loss_fn, tracer, rounds: int):
        self.strategy, self.loss_fn, self.tr, self.rounds = strategy, loss_fn, tracer, rounds
        self.saved = SavedTensorCounter()
        if hasattr(strategy, "saved_counter"):
            strategy.saved_counter = self.saved  # strategies with their own saved-tensor hooks
        self.params_seen = param_storages(strategy.model)
        # expert parallelism keeps this rank's experts outside the module tree
        # (jobs/parallel/expert.py): their weights, saved by F.linear as views, are parameters
        self.params_seen |= param_storages_of(getattr(strategy, "expert", {}).values())
        self.layer_spans = LayerSpans(tracer, model_layers(strategy))

    def run(self, mbs: list, sample) -> float:
        st, tr, rounds = self.strategy, self.tr, len(mbs)
        loss_sum = torch.zeros((), dtype=torch.float64, device=mbs[0][0].device)
        for i, (x, y) in enumerate(mbs):
            tr.microbatch = i
            sync = st.no_sync() if i < rounds - 1 else contextlib.nullcontext()
            with sync:
                self.saved.reset(self.params_seen)
                with tr.span("forward"), self.saved.hooks():
                    loss = self.loss_fn(st.forward(x).float(), y)
                sample("after_forward", activations=self.saved.bytes)
                with tr.span("backward"):
                    st.backward(loss / mb_divisor(rounds))
                    self.layer_spans.end_backward()
            loss_sum += loss.detach().double()
        tr.microbatch = None
        return loss_sum.item() / rounds

    def memory(self) -> dict:
        return {}

    def result(self) -> dict:
        return {}


class PipelineRunner:
    def __init__(self, rt, strategy, ctx, accum: int, m: int):
        self.rt, self.strategy, self.accum, self.m, self.tr = rt, strategy, accum, m, ctx.tracer
        if hasattr(rt, "params_seen"):  # EP experts live outside the stages (as DirectRunner)
            rt.params_seen |= param_storages_of(getattr(strategy, "expert", {}).values())
        p = ctx.spec.parallel
        self.sp_group = (ctx.mesh["tp"].get_group() if ctx.dims.tp > 1 and p.sequence_parallel
                         and p.engine != "native" else None)

    def run(self, mbs: list, sample) -> float | None:
        total, m = None, self.m
        with self.strategy.no_sync():
            for a in range(self.accum):
                loss = self.rt.step(mbs[a * m:(a + 1) * m])
                total = loss if total is None else total + loss
        if self.sp_group is not None:
            allreduce_sequence_parallel_grads(self.strategy.model, self.sp_group, self.tr)
        return total

    def memory(self) -> dict:
        out = {"activations": self.rt.peak["activation_bytes"]}
        if "recv_buffer_bytes" in self.rt.peak:
            out["recv_buffers"] = self.rt.peak["recv_buffer_bytes"]
        return out

    def result(self) -> dict:
        return {"pipeline_peak": self.rt.peak}
