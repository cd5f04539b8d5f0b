"""The native engine: PyTorch's own data-parallel components behind the same interface.

    ddp     torch.nn.parallel.DistributedDataParallel; a communication hook records each
            bucket's all-reduce (issued by the C++ reducer) with its bucket index; buckets are
            rebuilt after step 0.
    zero1   DistributedDataParallel + torch.distributed.optim.ZeroRedundancyOptimizer: it
            all-reduces the full gradients (DDP), updates the parameters it owns (whole
            parameters, so shards are uneven) and broadcasts each rank's updated parameters:
            2(N-1)/N·Ψ + Ψ per rank on a ring broadcast, not the seeds' reduce-scatter +
            all-gather. (`overlap_with_ddp` refuses gloo.)
    zero2   FSDP2 fully_shard(reshard_after_forward=False): parameters stay gathered between
            forward and backward (one all-gather per step, like ZeRO-2's parameter traffic).
    zero3   FSDP2 fully_shard(reshard_after_forward=True): gathered again for backward. FSDP2
            reshards the root after forward too: torch 2.13 keeps the root gathered only when
            reshard_after_forward is left unset (None), and it is set here. What it holds
            unsharded is measured (jobs/parallel/fsdp_meter.GatherMeter, around forward and
            backward) on ONE step, the run's first step traced in detail: `state_bytes`
            reports it as `gathered` / `gathered_peak` (the reference Zero3's names) during
            that step only.
            The meter runs Python after every aten op (that step about 2x on the tiny GPT),
            and FSDP2's holdings repeat step after step, so one step is the figure.
bf16 on FSDP2 uses MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16) with fp32 sharded
parameters as masters. Collectives issued from Python are captured by jobs/parallel/capture.py.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from jobs.models import layer_list
from jobs.parallel.base import Strategy, tensor_bytes
from jobs.parallel.capture import ORIGINAL, capture
from jobs.parallel.optim import make_optimizer, optimizer_class
from jobs.testbug import dp_divisor


def _local(t):
    if t is None:
        return None
    return t.to_local() if hasattr(t, "to_local") else t


class Native(Strategy):
    engine = "native"

    def __init__(self, model, group, tracer, **kw):
        super().__init__(model, group, tracer, **kw)
        self.opt = None

    def comm_context(self):
        return capture(self.tracer, {self.group: "dp"})

    def step(self) -> None:
        with self.tracer.span("optimizer", cat="compute"):
            self.opt.step()

    def zero_grad(self) -> None:
        self.opt.zero_grad(set_to_none=True)

    def _optim_bytes(self, state) -> int:
        return sum(tensor_bytes(_local(t)) for s in state.values() for t in s.values()
                   if torch.is_tensor(t) and t.numel() > 1)

    def state_bytes(self):
        ps = [_local(p) for p in self.model.parameters()]
        return {"params": sum(tensor_bytes(p) for p in ps),
                "grads": sum(tensor_bytes(_local(p.grad)) for p in self.model.parameters()),
                "optimizer": self._optim_bytes(self._state())}

    def _state(self):
        return self.opt.state


class NativeDDP(Native):
    name = "ddp"

    def __init__(self, model, group, tracer, *, zero: bool = False, **kw):
        if kw.get("precision") == "bf16":
            raise NotImplementedError("native DDP / ZeroRedundancyOptimizer: bf16 with fp32 "
                                      "masters has no native equivalent here; use the "
                                      "reference engine or FSDP2 (zero2/zero3)")
        super().__init__(model, group, tracer, **kw)
        with capture(self.tracer, {group: "dp"}):  # DDP's initial parameter broadcast
            self.ddp = nn.parallel.DistributedDataParallel(
                model, process_group=group, bucket_cap_mb=kw.get("bucket_mb", 25.0))
        self.ddp.register_comm_hook(None, self._hook)
        self.model = self.ddp
        if zero:
            from torch.distributed.optim import ZeroRedundancyOptimizer
            self.name = "zero1"
            self.opt = ZeroRedundancyOptimizer(model.parameters(),
                                               optimizer_class(self.optimizer),
                                               process_group=group, lr=self.lr)
            self.notes.append("ZeroRedundancyOptimizer: all-reduce (DDP) + broadcast of each "
                              "rank's updated parameters; shards are whole parameters")
        else:
            self.opt = make_optimizer(model.parameters(), self.optimizer, self.lr)

    def _hook(self, _state, bucket):
        buf = bucket.buffer()
        h = self.tracer.comm_start("all_reduce", payload_bytes=tensor_bytes(buf),
                                   group_size=self.n, axis="dp", group="dp",
                                   bucket=bucket.index(), source="ddp.comm_hook",
                                   device=False, **{"async": True})
        n = dp_divisor(self.n)
        all_reduce = ORIGINAL["all_reduce"]  # recorded here, not again by capture()
        fut = all_reduce(buf, group=self.group, async_op=True).get_future()

        def done(f):
            h.done()
            return f.value()[0].div_(n)
        return fut.then(done)

    def no_sync(self):
        return self.ddp.no_sync()

    def forward(self, *args):
        before = self.ddp._has_rebuilt_buckets
        out = self.ddp(*args)
        if self.n > 1 and not before and self.ddp._has_rebuilt_buckets:
            # the C++ reducer just rebuilt its buckets (after step 0) and synchronised the
            # bucket order from rank 0 with two broadcasts (Reducer::sync_bucket_indices:
            # parameter indices, then bucket sizes, int32). Issued in C++, so recorded here.
            nb = len(self.ddp.reducer._get_zeros_like_grad_buckets())
            np_ = len(list(self.ddp.module.parameters()))
            for what, elems in (("bucket_indices", np_ + 1), ("bucket_sizes", nb + 1)):
                with self.tracer.comm("broadcast", payload_bytes=4 * elems, group_size=self.n,
                                      axis="dp", group="dp", is_root=self.r == 0,
                                      source="ddp.reducer.sync_bucket_indices", what=what):
                    pass
        return out

    def full_parameters(self):
        return {n: p.detach().float().clone() for n, p in self.ddp.module.named_parameters()}

    def full_grads(self):
        return {n: p.grad.detach().float().clone()
                for n, p in self.ddp.module.named_parameters() if p.grad is not None}

    def _state(self):
        return self.opt.optim.state if hasattr(self.opt, "optim") else self.opt.state

    def layout(self):
        out = super().layout()
        if hasattr(self.opt, "optim"):  # ZeroRedundancyOptimizer: whole-parameter partition
            parts = self.opt._partition_parameters()
            out["owned_elems_per_rank"] = [sum(p.numel() for g in part for p in g["params"])
                                           for part in parts]
        return out


def undo_dp_average(model, n: int) -> None:
    """Test-only bug (jobs/testbug.py) for FSDP2, whose averaging happens inside its reduce-
    scatter (a divide factor of 1 needs PREMUL_SUM, which gloo lacks): scale the averaged
    gradients back up by n, the same result as never dividing."""
    if dp_divisor(n) == 1:
        for p in model.parameters():
            if p.grad is not None:
                p.grad.mul_(n)


class NativeFSDP(Native):
    def __init__(self, model, mesh, tracer, *, reshard: bool, **kw):
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        group = mesh.get_group()
        super().__init__(model, group, tracer, **kw)
        self.name = "zero3" if reshard else "zero2"
        mp = MixedPrecisionPolicy()
        if self.precision == "bf16":
            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
        for blk in layer_list(model) or []:
            fully_shard(blk, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp)
        fully_shard(model, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp)
        self.opt = make_optimizer(model.parameters(), self.optimizer, self.lr)
        self.meter = None  # the GatherMeter of the measured step (`_meter_step`)
        self._meter_step: int | None = None
        self._measured = not reshard  # zero2 keeps parameters gathered: no transient unit
        if reshard:
            self.notes.append("FSDP2 reshards every unit after forward, the root included "
                              "(reshard_after_forward=True set explicitly)")
            self.notes.append("gathered unit measured on the first traced step only "
                              "(jobs/parallel/fsdp_meter.py)")

    def _step_meter(self):
        """The meter of the tracer's current step: a new one on the first step traced in
        detail (the tracer's `begin_step` decided it), None on every other step."""
        step = self.tracer.step
        if step != self._meter_step:
            self._meter_step, self.meter = step, None
            if not self._measured and self.tracer.enabled:
                from jobs.parallel.fsdp_meter import GatherMeter
                self.meter, self._measured = GatherMeter(self.model), True
        return self.meter

    def forward(self, *args):
        meter = self._step_meter()
        if meter is None:
            return super().forward(*args)
        with meter:
            return super().forward(*args)

    def backward(self, loss) -> None:
        # the forward of this step decided (every micro-batch's backward follows its forward)
        meter = self.meter if self._meter_step == self.tracer.step else None
        if meter is None:
            return super().backward(loss)
        with meter:
            return super().backward(loss)

    def state_bytes(self):
        out = super().state_bytes()
        if self.meter is not None and self._meter_step == self.tracer.step:
            out.update(gathered=self.meter.sample(), gathered_peak=self.meter.peak)
        return out

    def finish_grads(self) -> None:
        undo_dp_average(self.model, self.n)

    # The runner's saved-tensor counter: FSDP2's unsharded weights (swapped in for a module's
    # forward) are parameters, not activations, though not the registered DTensor Parameters.
    _saved_counter = None

    @property
    def saved_counter(self):
        return self._saved_counter

    @saved_counter.setter
    def saved_counter(self, counter) -> None:
        self._saved_counter = counter
        if counter is not None:
            counter.exclude_fn = self._unsharded_storages

    def _unsharded_storages(self) -> set[int]:
        return {p.untyped_storage().data_ptr() for p in self.model.parameters()
                if not hasattr(p, "to_local")}

    def no_sync(self):
        import contextlib

        @contextlib.contextmanager
        def ctx():
            self.model.set_requires_gradient_sync(False)
            try:
                yield
            finally:
                self.model.set_requires_gradient_sync(True)
        return ctx()

    def full_parameters(self):
        return {n: p.full_tensor().detach().float().clone()
                for n, p in self.model.named_parameters()}

    def layout(self):
        local = [_local(p).numel() for p in self.model.parameters()]
        return {**super().layout(), "shard_elems": sum(local),
                "padding_elems": sum(local) * self.n - self.numel}
