"""The advisor's request, checked (jobs.theory.advisor; docs/advisor.md "Input"): the model
with the job spec's own rules, the cluster's rules, the degrees a request fixes, the batch
and `top`; SpecError naming the field. Standard library only."""

from __future__ import annotations

import dataclasses

from jobs.spec import ParallelSpec, SpecError, parse_spec, resolve_preset

MAX_TP = 64  # the largest tensor-parallel degree searched
MODEL_KEYS = ("arch", "layers", "hidden", "heads", "seq_len", "vocab", "t_forward",
              "t_backward_input", "t_backward_weight")
MOE_KEYS = ("experts", "top_k", "capacity_factor", "shared_expert", "aux_loss_coef",
            "capacity_scope")
CLUSTER_RULES = {"hosts": (int, 1, 1024), "devices_per_host": (int, 1, 1024),
                 "device_memory_bytes": (float, 1, None), "intra_GBps": (float, 1e-9, None),
                 "inter_GBps": (float, 1e-9, None), "flops": (float, 1, None)}
# the degrees a request may fix (the spec's own bounds: jobs.spec.ParallelSpec)
FIX_KEYS = ("tp", "pp", "microbatches", "zero_stage", "cp", "ep")


def _err(loc, msg, typ="value_error") -> dict:
    return {"loc": list(loc), "msg": msg, "type": typ}


def _model(model) -> dict:
    if not isinstance(model, dict):
        raise SpecError([_err(["model"], "must be an object")])
    data = dict(model)
    try:
        base = resolve_preset({"preset": data.pop("preset")}) if "preset" in data else {}
    except SpecError as exc:
        raise SpecError([{**e, "loc": ["model", *e["loc"]]} for e in exc.errors]) from exc
    merged = {**base.get("model", {}), **data}
    try:  # the spec's own field rules (types, ranges, unknown fields)
        spec = parse_spec({"model": merged, "runtime": {"nproc_per_node": 1}})
    except SpecError as exc:
        raise SpecError([e for e in exc.errors if e["loc"][:1] == ["model"]]
                        or exc.errors) from exc
    return {k: getattr(spec.model, k) for k in MODEL_KEYS + MOE_KEYS}


def _cluster(cluster, arch: str) -> dict:
    if not isinstance(cluster, dict):
        raise SpecError([_err(["cluster"], "must be an object")])
    errors, out = [], {}
    for name, (typ, lo, hi) in CLUSTER_RULES.items():
        v = cluster.get(name)
        if v is None:
            if name != "flops" or arch != "timed":
                errors.append(_err(["cluster", name], "field required" + (
                    " (FLOP/s per device: the compute term of gpt / mlp)"
                    if name == "flops" else ""), "missing"))
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or \
                (typ is int and float(v) != int(v)):
            kind = "an integer" if typ is int else "a number"
            errors.append(_err(["cluster", name], f"must be {kind}"))
        elif v < lo or (hi is not None and v > hi) or v in (float("inf"),):
            errors.append(_err(["cluster", name], f"must be >= {lo:g}" + (
                f" and <= {hi}" if hi else "") + " (and finite)", "range"))
        else:
            out[name] = typ(v)
    extra = set(cluster) - set(CLUSTER_RULES) - {"flops_source", "bandwidth_source", "queue"}
    errors += [_err(["cluster", k], "unknown field", "extra_forbidden") for k in sorted(extra)]
    if errors:
        raise SpecError(errors)
    for k in ("flops_source", "bandwidth_source", "queue"):
        if cluster.get(k) is not None:
            out[k] = str(cluster[k])
    return out


def _fix(fix, world: int) -> dict:
    """The degrees a request fixes, each checked with the spec's bounds; tp and pp must
    divide the world (hosts x devices_per_host)."""
    if fix is None:
        return {}
    if not isinstance(fix, dict):
        raise SpecError([_err(["fix"], "must be an object")])
    rules = {f.name: f.metadata for f in dataclasses.fields(ParallelSpec)}
    errors = [_err(["fix", k], f"unknown field; allowed: {', '.join(FIX_KEYS)}",
                   "extra_forbidden") for k in sorted(set(fix) - set(FIX_KEYS))]
    out = {}
    for k in FIX_KEYS:
        v = fix.get(k)
        if v is None:
            continue
        lo, hi = rules[k]["ge"], MAX_TP if k == "tp" else rules[k]["le"]
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            errors.append(_err(["fix", k], f"must be an integer between {lo} and {hi}"))
        else:
            out[k] = v
    for k in ("tp", "pp"):
        if k in out and world % out[k]:
            errors.append(_err(["fix", k], f"{k} = {out[k]} must divide the world size "
                               f"{world} (hosts x devices_per_host)"))
    if "tp" in out and "pp" in out and not errors and world % (out["tp"] * out["pp"]):
        errors.append(_err(["fix", "pp"], f"tp*pp = {out['tp'] * out['pp']} must divide the "
                           f"world size {world} (hosts x devices_per_host)"))
    if errors:
        raise SpecError(errors)
    return out


# compare_to: the layouts a request asks to place in the ranking (docs/advisor.md "compare_to")
MAX_COMPARE = 16
COMPARE_KEYS = ("tp", "pp", "dp", "micro_batch_size", "pp_schedule", "virtual_stages",
                "zero_stage", "activation_checkpointing", "cp", "ep")
SCHEDULE_V = {"1f1b": 1, "gpipe": 1, "interleaved": 2, "zero-bubble": 1, "zbv": 2}


def _compare(items, world: int, batch: int, arch: str) -> list[dict]:
    """The layouts of `compare_to`, each checked (SpecError naming compare_to.i.field):
    tp, pp, dp and micro_batch_size required (tp*pp*dp = the world; dp/cp*micro_batch_size
    divides global_batch); pp_schedule (pp > 1, default 1f1b), virtual_stages (default the
    schedule's), zero_stage, activation_checkpointing, cp, ep optional (left out: the best
    fitting value is placed). The answer adds `microbatches` = global_batch / (dp/cp) /
    micro_batch_size."""
    if items is None:
        return []
    if not isinstance(items, list) or len(items) > MAX_COMPARE:
        raise SpecError([_err(["compare_to"], f"must be a list of at most {MAX_COMPARE} "
                               "layouts")])
    rules = {f.name: f.metadata for f in dataclasses.fields(ParallelSpec)}
    errors, out = [], []
    for i, it in enumerate(items):
        loc = ["compare_to", i]
        if not isinstance(it, dict):
            errors.append(_err(loc, "must be an object"))
            continue
        errs = [_err(loc + [k], f"unknown field; allowed: {', '.join(COMPARE_KEYS)}",
                     "extra_forbidden") for k in sorted(set(it) - set(COMPARE_KEYS))]
        lay = {}
        for k in COMPARE_KEYS:
            v = it.get(k)
            if v is None:
                if k in ("tp", "pp", "dp", "micro_batch_size"):
                    errs.append(_err(loc + [k], "field required", "missing"))
                continue
            if k == "pp_schedule":
                if v not in SCHEDULE_V:
                    errs.append(_err(loc + [k], f"must be one of {', '.join(SCHEDULE_V)}"))
                else:
                    lay[k] = v
                continue
            if k == "activation_checkpointing":
                if not isinstance(v, bool) or (v and arch != "gpt"):
                    errs.append(_err(loc + [k], "must be a boolean (true for gpt only)"))
                else:
                    lay[k] = v
                continue
            lo, hi = (1, 1_000_000) if k == "micro_batch_size" else \
                (rules[k]["ge"], MAX_TP if k == "tp" else rules[k]["le"])
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                errs.append(_err(loc + [k], f"must be an integer between {lo} and {hi}"))
            else:
                lay[k] = v
        if not errs:
            tp, pp, dp, b, cp = lay["tp"], lay["pp"], lay["dp"], lay["micro_batch_size"], \
                lay.get("cp", 1)
            if tp * pp * dp != world:
                errs.append(_err(loc + ["dp"], f"tp*pp*dp = {tp * pp * dp} must equal the world "
                                 f"size {world} (hosts x devices_per_host)"))
            elif dp % cp or dp % lay.get("ep", 1):
                errs.append(_err(loc + ["dp"], "cp and ep must divide dp"))
            elif batch % (dp // cp * b):
                errs.append(_err(loc + ["micro_batch_size"], f"dp/cp*micro_batch_size = "
                                 f"{dp // cp * b} must divide global_batch {batch}"))
            elif pp == 1 and lay.get("pp_schedule", "1f1b") != "1f1b":
                errs.append(_err(loc + ["pp_schedule"], "a schedule needs pp > 1"))
            else:
                lay["microbatches"] = batch // (dp // cp * b)
                if "pp_schedule" in lay and "virtual_stages" not in lay:
                    lay["virtual_stages"] = SCHEDULE_V[lay["pp_schedule"]]
                out.append(lay)
        errors += errs
    if errors:
        raise SpecError(errors)
    return out


def check_request(model, global_batch, cluster, top: int = 20, fix=None,
                  compare_to=None) -> tuple:
    """The request's fields checked (SpecError naming the field): (model, cluster, fix) as
    the search takes them, and with `compare_to` given its layouts as a fourth. Cheap: no
    layout is enumerated."""
    m = _model(model)
    if isinstance(global_batch, bool) or not isinstance(global_batch, int) or \
            not 1 <= global_batch <= 1_000_000:
        raise SpecError([_err(["global_batch"], "must be an integer between 1 and 1000000")])
    c = _cluster(cluster, m["arch"])
    if not isinstance(top, int) or isinstance(top, bool) or not 1 <= top <= 500:
        raise SpecError([_err(["top"], "must be an integer between 1 and 500")])
    world = c["hosts"] * c["devices_per_host"]
    fixed = _fix(fix, world)
    if compare_to is None:
        return m, c, fixed
    return m, c, fixed, _compare(compare_to, world, global_batch, m["arch"])
