"""The advisor's request, checked (jobs.theory.advisor; docs/advisor.md "Input"): the model
with the job spec's own rules, the cluster's rules, the degrees a request fixes, the batch
and `top`; SpecError naming the field. Standard library only."""

from __future__ import annotations

import dataclasses

from jobs.spec import ParallelSpec, SpecError, parse_spec, resolve_preset

MAX_TP = 64  # the largest tensor-parallel degree searched
MODEL_KEYS = ("arch", "layers", "hidden", "heads", "seq_len", "vocab", "t_forward",
              "t_backward_input", "t_backward_weight")
MOE_KEYS = ("experts", "top_k", "capacity_factor", "shared_expert", "aux_loss_coef")
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


def check_request(model, global_batch, cluster, top: int = 20, fix=None) -> tuple:
    """The request's fields checked (SpecError naming the field): (model, cluster, fix) as
    the search takes them. Cheap: no layout is enumerated."""
    m = _model(model)
    if isinstance(global_batch, bool) or not isinstance(global_batch, int) or \
            not 1 <= global_batch <= 1_000_000:
        raise SpecError([_err(["global_batch"], "must be an integer between 1 and 1000000")])
    c = _cluster(cluster, m["arch"])
    if not isinstance(top, int) or isinstance(top, bool) or not 1 <= top <= 500:
        raise SpecError([_err(["top"], "must be an integer between 1 and 500")])
    return m, c, _fix(fix, c["hosts"] * c["devices_per_host"])
