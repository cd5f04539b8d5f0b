"""What FSDP2 (torch.distributed.fsdp.fully_shard) holds gathered, measured on CPU.

torch keeps no allocator statistics for CPU tensors, so the meter samples after every aten op
(a TorchDispatchMode: allocations happen inside ops, so the maximum over op boundaries is the
peak of the storages below) the bytes of the distinct storages FSDP2 keeps for the unsharded
state of the model, the counterpart of the reference engine's `gathered_peak`
(jobs/parallel/zero.Zero3.gathered):

    * every FSDPParam's all-gather outputs and unsharded parameter (freed by resizing the
      storage to 0: nbytes() is what is held),
    * its unsharded gradient (`unsharded_param.grad`, an accumulated one),
    * each parameter group's pending all-gather result (the flat all-gather output of a
      prefetched unit, before its copy-out) and the one kept for the next copy-in,
    * the reduce-scatter inputs FSDP2 retains (`comm_ctx.reduce_scatter_states`),
    * and what chunk_cat (FSDP2's own op) fills: the unsharded gradients into the
      reduce-scatter input. Gradients and reduce-scatter inputs are followed by a weak
      reference while they live (and the base of a view), so post_backward's unsharded
      gradients (taken off `.grad` into a local list before the reduce-scatter) count until
      freed; all-gather buffers count while FSDP2 references them (`_reachable`). Storages
      are counted once; a storage FSDP2 resized to 0 counts 0.

Sharded parameters, sharded gradients and optimizer state are model state, not counted.
"""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


def _states(model) -> list:
    from torch.distributed.fsdp import FSDPModule
    out = []
    for m in model.modules():
        if isinstance(m, FSDPModule):
            st = m._get_fsdp_state()
            if st._fsdp_param_group is not None:
                out.append(st._fsdp_param_group)
    return out


class GatherMeter(TorchDispatchMode):
    """Peak bytes of FSDP2's unsharded parameters, gradients and collective buffers."""

    def __init__(self, model):
        super().__init__()
        self.groups = _states(model)
        assert self.groups, "no fully_shard module in the model"
        self.followed: dict[int, weakref.ref] = {}
        self.now = self.peak = 0
        self.samples = 0

    def _reachable(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """(all-gather buffers, the rest) FSDP2's state references now. The all-gather buffers
        count only while FSDP2 references them: once dropped, gloo's worker thread may still
        hold a finished collective's output for a moment, which made the peak depend on
        thread timing (one block's buffer more on one rank, once in ~45 runs)."""
        gathered, rest = [], []
        for g in self.groups:
            for fp in g.fsdp_params:
                gathered += fp.all_gather_outputs
                up = getattr(fp, "_unsharded_param", None)
                if up is not None:
                    rest += [up, up.grad]
                rest.append(fp.unsharded_accumulated_grad)
            if g._all_gather_result is not None:
                gathered.append(g._all_gather_result.all_gather_output)
            # both set by the comm context's lazy_init, at the root's first forward: ops
            # before it (a bf16 cast of the input on the run's first step) find neither
            ctx = g.comm_ctx
            ag = getattr(ctx, "all_gather_state", None)
            if ag is not None:
                gathered.append(ag.all_gather_result.all_gather_output)
            rest += [rs.reduce_scatter_input for rs in getattr(ctx, "reduce_scatter_states", ())]
        keep = lambda ts: [t for t in ts if isinstance(t, torch.Tensor)]  # noqa: E731
        return keep(gathered), keep(rest)

    def _follow(self, ts) -> None:
        for t in ts:
            # a view dies before its storage: follow the base it was taken from as well
            for x in (t, t._base):
                if x is not None and id(x) not in self.followed:
                    self.followed[id(x)] = weakref.ref(x)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.namespace == "fsdp" and func._opname == "chunk_cat":
            # chunk_cat(unsharded grads, out=reduce-scatter input) returns nothing: follow its
            # operands (all_gather_copy_in's flat buffers are counted while FSDP2 holds them)
            follow = (args, kwargs, out)
            self._follow(t for t in tree_leaves(follow) if isinstance(t, torch.Tensor))
        self.sample()
        return out

    def sample(self) -> int:
        """The bytes held now (also between ops: a memory sample outside the mode)."""
        gathered, rest = self._reachable()
        self._follow(rest)
        held: dict[int, int] = {}
        for t in gathered:
            s = t.untyped_storage()
            if s.nbytes():
                held[s.data_ptr()] = s.nbytes()
        for i, ref in list(self.followed.items()):
            t = ref()
            if t is None:
                del self.followed[i]
                continue
            s = t.untyped_storage()
            if s.nbytes():
                held[s.data_ptr()] = s.nbytes()
        self.now = sum(held.values())
        self.peak = max(self.peak, self.now)
        self.samples += 1
        return self.now
