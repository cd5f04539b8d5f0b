"""The correctness gate's single-process reference and comparisons (tests only).

Every strategy x engine is compared with one process training the same global batches:
  - gradients after step 0 (reduced, averaged, gathered to full shape), fp32, rel. 1e-5;
  - parameters after the last step, and the loss curve, with Adam and with plain SGD
    (SGD moves by lr * gradient, so a constant gradient scale (a missing 1/dp or 1/m)
    shows; Adam normalises it away);
  - bf16 runs against a bf16 single process (the same bf16 compute, fp32 masters).
"""

from __future__ import annotations

from pathlib import Path

import torch

from jobs.data import global_batch
from jobs.models import model_module

TOL = 1e-5  # fp32: relative error of gradients / parameters / losses


def reference(spec, capacity_group: int | None = None) -> dict:
    """{"params": after the last step, "grads": after step 0, "loss": per step} of a single
    process (plain torch in fp32; the Single strategy's bf16 compute with fp32 masters).
    `capacity_group`: MoE blocks route the global batch in groups of that many sequences (the
    micro-batch a rank of the compared layout routes; capacity_scope "rank"; default: that of
    `spec`'s own layout)."""
    mod = model_module(spec.model.arch)
    model = mod.build(spec.model, spec.train.seed)
    capacity_group = capacity_group or rank_microbatch(spec)
    if capacity_group:
        from jobs.models.moe import moe_blocks
        for _, blk in moe_blocks(model):
            blk.capacity_group = capacity_group
    t = spec.train
    if t.precision == "bf16":
        from jobs.parallel.data import Single
        st = Single(model, lr=t.lr, precision="bf16", fp32_grads=t.fp32_grads,
                    optimizer=t.optimizer)
        fwd, params, step = st.forward, st.full_parameters, st.step
        zero, grads = st.zero_grad, st.full_grads
    else:
        # torch's own classes: the jobs step torch's functional update (jobs/parallel/optim.py)
        cls = {"adam": torch.optim.Adam, "sgd": torch.optim.SGD}[t.optimizer]
        opt = cls(model.parameters(), lr=t.lr)
        fwd, step, zero = model, opt.step, opt.zero_grad

        def params():
            return {n: p.detach().clone() for n, p in model.named_parameters()}

        def grads():
            return {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    out: dict = {"loss": []}
    for s in range(t.steps):
        x, y = global_batch(spec, s)
        zero()
        loss = mod.loss_fn(fwd(x).float(), y)
        loss.backward()
        out["loss"].append(float(loss.detach()))
        if s == 0:
            out["grads"] = grads()
        step()
    out["params"] = params()
    return out


def rel_err(got: dict, ref: dict) -> float:
    """||got - ref|| / ||ref|| over every tensor (the names must match)."""
    assert set(got) == set(ref), sorted(set(got) ^ set(ref))
    num = sum(float((got[k].float() - ref[k].float()).pow(2).sum()) for k in ref)
    den = sum(float(ref[k].float().pow(2).sum()) for k in ref)
    return (num / den) ** 0.5


def max_abs(got: dict, ref: dict) -> float:
    return max(float((got[k].float() - ref[k].float()).abs().max()) for k in ref)


def loss_err(got: list[float], ref: list[float]) -> float:
    return max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(got, ref, strict=True))


def assemble(out: Path, ref: dict, what: str = "params") -> dict:
    """Full tensors from every dp-0 rank's `{what}-rank{R}.pt` (tp shards concatenated)."""
    shards: dict = {}
    for f in sorted(out.glob(f"{what}-rank*.pt")):
        d = torch.load(f)
        if d["coords"]["dp"]:
            continue
        for n, t in d["params"].items():
            shards.setdefault(n, {})[d["coords"]["tp"]] = t
    full = {}
    for n, by_tp in shards.items():
        parts = [by_tp[i] for i in sorted(by_tp)]
        if parts[0].shape == ref[n].shape:
            full[n] = parts[0]
        else:
            dim = 0 if parts[0].shape[0] != ref[n].shape[0] else 1
            full[n] = torch.cat(parts, dim)
    return full


_SINGLE: dict = {}


def rank_microbatch(s) -> int | None:
    """Sequences one rank routes per forward in the layout of a parsed spec, for MoE with
    capacity_scope "rank" (capacity is decided over them); None otherwise."""
    if not s.model.experts or s.model.capacity_scope != "rank":
        return None
    p = s.parallel
    return s.train.global_batch // (p.dp * p.microbatches * s.train.grad_accum)


def single_reference(data: dict) -> dict:
    """reference() of a spec dict's model and train settings on one process (dp 1, one rank),
    cached: several layouts of one model share it. MoE with capacity_scope "rank": the single
    process routes the global batch in groups of the layout's per-rank micro-batch."""
    import json

    from jobs.spec import parse_spec
    group = rank_microbatch(parse_spec(data, max_world_size=64))
    key = json.dumps([data["model"], data["train"], group], sort_keys=True)
    if key not in _SINGLE:
        one = {**data, "parallel": {"dp": 1}, "runtime": {"nproc_per_node": 1}}
        _SINGLE[key] = reference(parse_spec(one, max_world_size=8), capacity_group=group)
    return _SINGLE[key]


def dumped_state(out: Path, ref: dict) -> tuple[dict, dict]:
    """(step-0 gradients, final parameters) a run dumped (PARALAB_DUMP_PARAMS=1): whole
    tensors, or per-rank files with their TP shards assembled."""
    if (out / "grads-step0.pt").exists():
        return torch.load(out / "grads-step0.pt"), torch.load(out / "params-final.pt")
    return assemble(out, ref["grads"], "grads"), assemble(out, ref["params"])
