"""Validation of a what-if object, and the same inputs derived from a real JobSpec (no torch)."""

from __future__ import annotations

from jobs.schedules import SCHEDULES, placement_of
from jobs.spec import DP_MODES, JobSpec, SpecError, derive_strategy

from .comm import ALGORITHMS, COMM_CONVENTIONS
from .memory import MEMORY_MODELS, memory_model_of_spec
from .model import param_count, rank_blocks, stage_params
from .moe import expert_params

BUBBLE_CONVENTIONS = ("total", "ideal")
MAX_NPROC_PER_NODE = 1024  # the spec's bound (runtime.nproc_per_node); links.py loops over it
# A what-if may go past the spec's 4096 stages (a 10,000-stage pipeline is simulated in
# bounded work, tests/theory/test_predict.py), but per-rank lists grow with pp and per-block
# lists with layers: both are bounded, so a huge integer is a 422, not a 500 or a hang.
MAX_PP = 10_000
MAX_LAYERS = 100_000
ARCHS = ("gpt", "mlp", "timed")

# name: (type, required, default, rule)   rule: ("ge", x) | ("gt", x) | ("range", lo, hi) | enum
FIELDS: dict[str, tuple] = {
    "params": ("int", True, None, ("ge", 1)),
    "dp": ("int", True, None, ("ge", 1)),
    "tp": ("int", True, None, ("ge", 1)),
    "pp": ("int", True, None, ("range", 1, MAX_PP)),
    "zero_stage": ("int", True, None, ("range", 0, 3)),
    "memory_model": ("str", True, None, tuple(MEMORY_MODELS)),
    "grad_bytes": ("float", False, None, ("gt", 0)),
    "bandwidth_GBps": ("float", False, None, ("gt", 0)),
    # two links (links.py): hosts, ranks per host (default dp*tp*pp / nnodes), and the busbw of
    # each link (default bandwidth_GBps, else links.DEFAULT_INTRA_GBPS / DEFAULT_INTER_GBPS)
    "nnodes": ("int", False, 1, ("ge", 1)),
    "nproc_per_node": ("int", False, None, ("range", 1, MAX_NPROC_PER_NODE)),
    "intra_bandwidth_GBps": ("float", False, None, ("gt", 0)),
    "inter_bandwidth_GBps": ("float", False, None, ("gt", 0)),
    "compute_ms": ("float", False, None, ("ge", 0)),
    "microbatches": ("int", False, 1, ("ge", 1)),
    "virtual_stages": ("int", False, 1, ("ge", 1)),
    "pp_schedule": ("str", False, "1f1b", SCHEDULES),
    "dp_mode": ("str", False, "ddp", DP_MODES),
    "allreduce_algorithm": ("str", False, "ring", ALGORITHMS),
    "bubble_convention": ("str", False, "total", BUBBLE_CONVENTIONS),
    "comm_convention": ("str", False, "ring-exact", COMM_CONVENTIONS),
    "arch": ("str", False, "gpt", ARCHS),
    "layers": ("int", False, None, ("range", 1, MAX_LAYERS)),
    "hidden": ("int", False, None, ("ge", 1)),
    "heads": ("int", False, None, ("ge", 1)),
    "seq_len": ("int", False, None, ("ge", 1)),
    "micro_batch_size": ("int", False, None, ("ge", 1)),
    "grad_accum": ("int", False, 1, ("ge", 1)),
    "sequence_parallel": ("bool", False, False, None),
    "activation_checkpointing": ("bool", False, False, None),
    "act_bytes": ("float", False, None, ("gt", 0)),
    "t_f": ("float", False, None, ("ge", 0)),
    "t_b_input": ("float", False, None, ("ge", 0)),
    "t_b_weight": ("float", False, None, ("ge", 0)),
}


def _err(loc, msg, typ="value_error"):
    return {"loc": [loc] if isinstance(loc, str) else list(loc), "msg": msg, "type": typ}


def _check(name, value, spec, errors):
    ftype, _, _, rule = spec
    if ftype == "bool":
        if not isinstance(value, bool):
            errors.append(_err(name, "must be true or false", "bool_type"))
            return None
        return value
    if ftype == "str":
        if not isinstance(value, str) or value not in rule:
            errors.append(_err(name, f"must be one of {', '.join(rule)}", "enum"))
            return None
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        errors.append(_err(name, "must be a number" if ftype == "float" else
                           "must be an integer", f"{ftype}_type"))
        return None
    if ftype == "int":
        if isinstance(value, float) and not value.is_integer():
            errors.append(_err(name, "must be an integer", "int_type"))
            return None
        value = int(value)
    else:
        value = float(value)
    kind = rule[0]
    if kind == "ge" and value < rule[1]:
        errors.append(_err(name, f"must be >= {rule[1]:g}", "greater_than_equal"))
        return None
    if kind == "gt" and value <= rule[1]:
        errors.append(_err(name, f"must be > {rule[1]:g}", "greater_than"))
        return None
    if kind == "range" and not rule[1] <= value <= rule[2]:
        errors.append(_err(name, f"must be between {rule[1]} and {rule[2]}", "range"))
        return None
    return value


def parse_whatif(data: dict) -> dict:
    """Validated, defaulted what-if inputs; raises SpecError naming the field and the rule."""
    if not isinstance(data, dict):
        raise SpecError([_err((), "must be an object", "dict_type")])
    errors: list[dict] = []
    for key in data:
        if key not in FIELDS:
            errors.append(_err(key, f"unknown field; allowed: {', '.join(FIELDS)}",
                               "extra_forbidden"))
    out: dict = {}
    for name, spec in FIELDS.items():
        if name not in data or data[name] is None:
            if spec[1]:
                errors.append(_err(name, "field required", "missing"))
            out[name] = spec[2]
            continue
        out[name] = _check(name, data[name], spec, errors)
    if errors:
        raise SpecError(errors)
    _cross(out, errors)
    if errors:
        raise SpecError(errors)
    return out


def _cross(w: dict, errors: list) -> None:
    world = w["dp"] * w["tp"] * w["pp"]
    if w["nproc_per_node"] is None:
        if world % w["nnodes"]:
            errors.append(_err("nnodes", f"nnodes = {w['nnodes']} must divide dp*tp*pp = "
                               f"{world} (ranks per host = dp*tp*pp / nnodes)"))
        elif w["nnodes"] > 1 and world // w["nnodes"] > MAX_NPROC_PER_NODE:
            errors.append(_err("nnodes", f"dp*tp*pp / nnodes = {world // w['nnodes']} ranks "
                               f"per host; at most {MAX_NPROC_PER_NODE}"))
        else:
            w["nproc_per_node"] = world // w["nnodes"]
    elif w["nnodes"] * w["nproc_per_node"] != world:
        errors.append(_err("nproc_per_node", f"nnodes*nproc_per_node = {w['nnodes']}*"
                           f"{w['nproc_per_node']} must equal dp*tp*pp = {world}"))
    if w["pp_schedule"] == "zbv":
        if w["virtual_stages"] != 2:
            errors.append(_err("virtual_stages", f"virtual_stages = {w['virtual_stages']} must "
                               "be 2 with pp_schedule 'zbv' (two chunks per rank in a V)"))
    elif w["virtual_stages"] > 1 and w["pp_schedule"] != "interleaved":
        errors.append(_err("virtual_stages",
                           "must be 1 unless pp_schedule is 'interleaved' (or 2 with 'zbv')"))
    if w["pp"] > 1 and w["pp_schedule"] == "interleaved" and w["microbatches"] % w["pp"]:
        errors.append(_err("microbatches", f"microbatches = {w['microbatches']} must be a "
                           f"multiple of pp = {w['pp']} for the interleaved schedule"))
    if w["zero_stage"] and w["dp_mode"] == "ps":
        errors.append(_err("zero_stage", "ZeRO cannot be combined with dp_mode 'ps'"))
    if w["sequence_parallel"] and w["tp"] < 2:
        errors.append(_err("sequence_parallel", "needs tp > 1"))
    if w["allreduce_algorithm"] == "butterfly" and w["dp"] & (w["dp"] - 1):
        errors.append(_err("allreduce_algorithm",
                           f"butterfly needs a power-of-two dp, got {w['dp']}"))


def stage_times(spec: JobSpec) -> dict | None:
    """Seconds per model stage and micro-batch of a `timed` spec, the simulator's inputs:
    {"t_f", "t_b_input", "t_b_weight"} = layers per chunk x the per-layer sleeps; None for other
    architectures (their times are measured, not configured)."""
    m, p = spec.model, spec.parallel
    if m.arch != "timed":
        return None
    k = m.layers / (p.pp * p.virtual_stages)
    return {"t_f": k * m.t_forward, "t_b_input": k * m.t_backward_input,
            "t_b_weight": k * m.t_backward_weight}


def inputs_from_spec(spec: JobSpec, overrides: dict | None = None) -> dict:
    """The what-if inputs a JobSpec implies (params counted from its model), plus `overrides`
    (bandwidth_GBps, compute_ms, conventions, ...; validated like a what-if)."""
    m, p, t = spec.model, spec.parallel, spec.train
    fp32 = t.precision == "fp32"
    w = {name: f[2] for name, f in FIELDS.items()}
    w.update(
        params=param_count(m), dp=p.dp, tp=p.tp, pp=p.pp, zero_stage=p.zero_stage,
        memory_model=memory_model_of_spec(spec), grad_bytes=4.0 if fp32 else 2.0,
        act_bytes=4.0 if fp32 else 2.0, microbatches=p.microbatches,
        virtual_stages=p.virtual_stages, pp_schedule=p.pp_schedule, dp_mode=p.dp_mode,
        arch=m.arch, layers=m.layers, hidden=m.hidden, heads=m.heads,
        seq_len=m.seq_len if m.arch == "gpt" else 1,
        micro_batch_size=max(1, t.global_batch // (p.dp * p.microbatches * t.grad_accum)),
        grad_accum=t.grad_accum, sequence_parallel=p.sequence_parallel,
        activation_checkpointing=t.activation_checkpointing,
        nnodes=spec.runtime.nnodes, nproc_per_node=spec.runtime.nproc_per_node)
    if m.arch == "timed":  # seconds per model stage = layers per chunk x seconds per layer
        w.update(stage_times(spec))
    if overrides:
        base = {k: v for k, v in w.items() if v is not None}
        if "nproc_per_node" not in overrides:  # re-derived: dp*tp*pp / nnodes (a what-if
            del base["nproc_per_node"]         # host count or degree re-splits the world)
        checked = parse_whatif({**base, **overrides})
        w.update({k: checked[k] for k in overrides})
        w["nproc_per_node"] = checked["nproc_per_node"]
    full = stage_params(m, p.pp, p.virtual_stages, p.tp, placement_of(p.pp_schedule))
    # expert parallelism: a rank holds experts / ep of the routed experts of each block of its
    # pipeline stages; rank_params counts what it holds, rank_expert_params the EP-sharded part
    ep = p.ep if m.experts else 1
    blocks = rank_blocks(m.layers, p.pp, p.virtual_stages, placement_of(p.pp_schedule))
    psi_e = [expert_params(b, m.hidden, m.experts) if ep > 1 else 0 for b in blocks]
    w["rank_params"] = [x - e + e // ep for x, e in zip(full, psi_e, strict=True)]
    w["rank_expert_params"] = [e // ep for e in psi_e]
    # context parallelism: the cp ranks of a replica split its micro-batch's sequences, so a
    # CP rank holds cp_batch sequences of seq_len/cp tokens (micro_batch_size stays
    # global_batch/(dp*m*accum), the same token count where it divides)
    w["cp"] = p.cp
    w["cp_batch"] = t.global_batch // (p.dp // p.cp * p.microbatches * t.grad_accum)
    w.update(ep=ep, experts=m.experts, top_k=m.top_k, capacity_factor=m.capacity_factor,
             capacity_scope=m.capacity_scope,
             shared_expert=m.shared_expert, aux_loss_coef=m.aux_loss_coef)
    w["strategy"] = derive_strategy(spec)
    w["world_size"] = spec.world_size
    w["bucket_mb"] = p.bucket_mb
    w["vocab"], w["vocab_parallel"] = m.vocab, p.vocab_parallel
    return w
