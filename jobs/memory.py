"""Memory accounting: exact bytes of model state per category, activations saved for backward,
and the process's RSS / CUDA allocator peaks.

Model-state bytes come from the strategy (`Strategy.state_bytes()`: the tensors this rank
really holds, local shards only). Activation bytes come from saved-tensor hooks: every tensor
autograd saves for backward during a forward is counted once (by storage), parameters excluded.
`MemoryBook` keeps per-category peaks over all samples of a run.
"""

from __future__ import annotations

import torch

CATEGORIES = ("params", "grads", "optimizer", "gathered", "activations")


class SavedTensorCounter:
    """Counts bytes of tensors saved for backward: per storage, the union of the byte ranges
    the saved views cover (a slice of a larger batch counts its own bytes, not the whole batch;
    a tensor saved twice, or q and its transpose, once). Parameters are excluded, and so is any
    other leaf that requires grad (FSDP2's gathered weights are not the registered
    Parameters) unless it is `allow`ed (a pipeline stage's received input) or `skip_leaves` is
    False (torch.distributed.pipelining's stage inputs, which it does not hand to us)."""

    def __init__(self, exclude_storages=(), skip_leaves: bool = True):
        self.exclude = set(exclude_storages)
        self.skip_leaves = skip_leaves
        self.exclude_fn = None  # storages to skip right now (FSDP2's gathered weights)
        self.spans: dict[int, list[tuple[int, int]]] = {}
        self.allowed: set[int] = set()
        self.bytes = 0

    def reset(self, exclude_storages=None) -> None:
        self.spans.clear()
        self.allowed.clear()
        self.bytes = 0
        if exclude_storages is not None:
            self.exclude = set(exclude_storages)

    def allow(self, t: torch.Tensor) -> None:
        self.allowed.add(id(t))

    def count(self, t: torch.Tensor) -> None:
        if isinstance(t, torch.nn.Parameter) or not isinstance(t, torch.Tensor):
            return
        if self.skip_leaves and t.is_leaf and t.requires_grad and id(t) not in self.allowed:
            return
        t = _local(t)
        try:
            st = t.untyped_storage()
            key = st.data_ptr()
        except (RuntimeError, NotImplementedError):  # e.g. other wrapper subclasses
            return
        if key in self.exclude or key == 0 or t.numel() == 0:
            return
        if self.exclude_fn is not None and key in self.exclude_fn():
            return
        es = t.element_size()
        extent = 1 + sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride(), strict=True))
        lo = t.storage_offset() * es
        spans = self.spans.setdefault(key, [])
        before = _union(spans)
        spans.append((lo, min(lo + extent * es, st.nbytes())))
        self.bytes += _union(spans) - before

    def pack(self, t):
        self.count(t)
        return t

    @staticmethod
    def unpack(t):
        return t

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)


def _union(spans: list[tuple[int, int]]) -> int:
    total, end = 0, -1
    for lo, hi in sorted(spans):
        if hi <= end:
            continue
        total += hi - max(lo, end)
        end = hi
    return total


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (what this rank holds), without an autograd op."""
    return getattr(t, "_local_tensor", t)


def param_storages(model: torch.nn.Module) -> set[int]:
    return param_storages_of(model.parameters())


def param_storages_of(params) -> set[int]:
    out = set()
    for p in params:
        try:
            out.add(_local(p).untyped_storage().data_ptr())
        except (RuntimeError, NotImplementedError):
            pass
    return out


class MemoryBook:
    """Per-category peaks (bytes) over samples, and the phase at which each peak occurred."""

    def __init__(self):
        self.peak: dict[str, int] = {}
        self.at: dict[str, str] = {}
        self.samples: list[dict] = []

    def add(self, phase: str, step: int, sample: dict) -> None:
        # keep set-up, step 0 and the latest step only (long runs stay small)
        if self.samples and self.samples[-1]["step"] not in (-1, 0, step):
            last = self.samples[-1]["step"]
            self.samples = [x for x in self.samples if x["step"] != last]
        self.samples.append({"phase": phase, "step": step, **sample})
        for k, v in sample.items():
            if isinstance(v, int) and v >= self.peak.get(k, -1):
                self.peak[k] = v
                self.at[k] = f"step {step} {phase}"

    def summary(self) -> dict:
        model_state = {k: self.peak.get(k, 0) for k in ("params", "grads", "optimizer")}
        return {"peak_bytes": dict(self.peak), "peak_at": dict(self.at),
                "model_state_peak_bytes": model_state,
                "phases": [s for s in self.samples if s["step"] in (-1, 0, self._last_step())]}

    def _last_step(self) -> int:
        return max((s["step"] for s in self.samples), default=0)


def process_memory() -> dict:
    from jobs.trace import _rss_bytes
    out = {"rss_bytes": _rss_bytes()}
    if torch.cuda.is_available():
        out["cuda_allocated_bytes"] = torch.cuda.memory_allocated()
        out["cuda_peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
    return out
