"""The advisor: every layout of a model on a cluster that the service accepts and that fits in
device memory, ranked by predicted step time (docs/advisor.md).

advise(model, global_batch, cluster, top=20) -> dict
    model    {"preset": NAME, ...field overrides} or explicit fields of jobs.spec.ModelSpec
             (arch, layers, hidden, heads, seq_len, vocab; timed: t_forward, t_backward_input,
             t_backward_weight)
    cluster  {"hosts", "devices_per_host", "device_memory_bytes", "intra_GBps", "inter_GBps",
             "flops" (FLOP/s per device; needed for gpt / mlp), "flops_source" (text, optional),
             "bandwidth_source" (text, optional), "queue" (optional: runtime.queue of the specs)}
Every candidate is a spec dict validated by jobs.spec.parse_spec (require_available, as at
submit) and predicted by jobs.theory.predict; the compute term is jobs.theory.compute's.
Invalid input raises SpecError naming the field. Standard library only.
"""

from __future__ import annotations

import copy
import json
from functools import lru_cache

from jobs.spec import SpecError, parse_spec, resolve_preset

from . import advisor_rules as R
from .compute import training_flops
from .predict import predict

# (schedule, virtual stages) tried for pp > 1; naive is GPipe with m = 1, always dominated
SCHEDULES = (("1f1b", 1), ("gpipe", 1), ("interleaved", 2), ("zero-bubble", 1), ("zbv", 2))
MAX_TP = 64
MODEL_KEYS = ("arch", "layers", "hidden", "heads", "seq_len", "vocab", "t_forward",
              "t_backward_input", "t_backward_weight")
MOE_KEYS = ("experts", "top_k", "capacity_factor", "shared_expert", "aux_loss_coef")
CLUSTER_RULES = {"hosts": (int, 1, 1024), "devices_per_host": (int, 1, 1024),
                 "device_memory_bytes": (float, 1, None), "intra_GBps": (float, 1e-9, None),
                 "inter_GBps": (float, 1e-9, None), "flops": (float, 1, None)}


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


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def enumerate_layouts(m: dict, batch: int, hosts: int, per_host: int):
    """Yield (layout, pruned_reason | None): the search space, pruned by divisibility before
    any spec is built (the spec validator re-checks every survivor)."""
    world = hosts * per_host
    for tp in _divisors(world):
        if tp > MAX_TP:
            continue
        for pp in _divisors(world // tp):
            dp = world // (tp * pp)
            for lay in _variants(m, dp, tp, pp):
                yield lay, _pruned(m, batch, lay)


def _cps(m: dict, dp: int) -> tuple[int, ...]:
    """Context-parallel degrees tried: 1, and for gpt every divisor of dp that splits the
    sequence into 2*cp load-balanced chunks (jobs.spec's CP rules re-check the rest)."""
    if m["arch"] != "gpt":
        return (1,)
    return tuple(c for c in _divisors(dp) if c == 1 or m["seq_len"] % (2 * c) == 0)


def _eps(m: dict, dp: int) -> tuple[int, ...]:
    """Expert-parallel degrees tried for a mixture of experts: divisors of dp that divide the
    experts (jobs.spec's EP rules re-check the rest); 1 for a dense model."""
    return tuple(e for e in _divisors(dp) if m["experts"] % e == 0) if m["experts"] else (1,)


def _variants(m: dict, dp: int, tp: int, pp: int):
    scheds = SCHEDULES if pp > 1 else (("1f1b", 1),)
    micro = (pp, 2 * pp, 4 * pp) if pp > 1 else (1, 2, 4, 8)
    ckpts = (False, True) if m["arch"] == "gpt" else (False,)
    cps = (1,) if m["experts"] else _cps(m, dp)  # CP with experts is refused (jobs.spec)
    for cp in cps:
        for ep in _eps(m, dp):
            for zero in range(4) if dp > 1 else (0,):
                for sched, v in scheds:
                    for mb in micro:
                        for ck in ckpts:
                            if (cp > 1 or ep > 1) and (ck or zero == 3):
                                continue  # refused with cp / ep (jobs.spec): not counted
                            yield {"dp": dp, "tp": tp, "pp": pp, "zero_stage": zero,
                                   "pp_schedule": sched, "virtual_stages": v,
                                   "microbatches": mb, "activation_checkpointing": ck,
                                   "cp": cp, "ep": ep}


def _pruned(m: dict, batch: int, lay: dict) -> str | None:
    if lay["tp"] > 1 and (m["arch"] != "gpt" or m["hidden"] % lay["tp"]
                          or m["heads"] % lay["tp"]):
        return "tp must divide hidden and heads (gpt only)"
    if m["layers"] % (lay["pp"] * lay["virtual_stages"]):
        return "pp*virtual_stages must divide layers"
    if batch % (lay["dp"] // lay["cp"] * lay["microbatches"]):
        return "dp/cp*microbatches must divide global_batch"
    return None


def spec_of(m: dict, batch: int, c: dict, lay: dict, steps: int = 5) -> dict:
    """The job-spec dict of one layout (what the page launches)."""
    mp = lay["tp"] > 1 or lay["pp"] > 1
    model = {k: m[k] for k in MODEL_KEYS if m["arch"] == "timed" or not k.startswith("t_")}
    if m["experts"]:
        model.update({k: m[k] for k in MOE_KEYS})
    spec = {"name": "advise-" + R.label(lay), "model": model,
            "parallel": {k: lay[k] for k in ("dp", "tp", "pp", "zero_stage", "pp_schedule",
                                             "virtual_stages", "microbatches")},
            "train": {"global_batch": batch, "steps": steps, "precision": "fp32",
                      "activation_checkpointing": lay["activation_checkpointing"]},
            "runtime": {"nnodes": c["hosts"], "nproc_per_node": c["devices_per_host"]}}
    if lay["zero_stage"] == 3 and mp:  # reference ZeRO-3 refuses tp/pp: FSDP2 does it
        spec["parallel"]["engine"] = "native"
    for axis in ("cp", "ep"):
        if lay[axis] > 1:
            spec["parallel"][axis] = lay[axis]
    if c.get("queue"):
        spec["runtime"]["queue"] = c["queue"]
    return spec


@lru_cache(maxsize=50_000)
def _evaluate(spec_json: str, intra: float, inter: float, flops: float | None) -> dict:
    """(parse, predict) of one spec, cached: the page re-asks the same cluster often."""
    data = json.loads(spec_json)
    try:
        spec = parse_spec(data, max_world_size=1 << 30, require_available=True)
    except SpecError as exc:
        e = exc.errors[0]  # the first rule it breaks names the reason; the list is elided
        return {"invalid": f"{'.'.join(map(str, e['loc']))}: {e['msg'].split(' (available:')[0]}"}
    over = {"intra_bandwidth_GBps": intra, "inter_bandwidth_GBps": inter}
    if spec.model.arch != "timed" and flops:  # no rate: no compute term, no step time
        total, _ = training_flops(spec.model, spec.train.global_batch,
                                  spec.train.activation_checkpointing)
        over["compute_ms"] = total / flops * 1000
    pred = predict(spec, **over)
    step = pred["step"]  # predict's own step time: one definition (jobs/theory/predict.py)
    busy, pipe = step["per_rank_compute_s"], step["pipeline_compute_s"]
    comm = {r["axis"]: r["time_s"] for r in pred["comm"]["links"]["per_axis"]}
    links = {r["axis"]: r["link"] for r in pred["comm"]["links"]["per_axis"]}
    return {"memory_bytes": pred["memory"]["per_rank_bytes"],
            "memory_components": pred["memory"]["components"],
            "compute_s": busy, "bubble_s": max(0.0, pipe - busy), "comm_s": comm,
            "links": links, "comm_bytes": pred["comm"]["components"],
            "step_s": step["time_no_overlap_s"],
            "bubble_fraction": pred["pipeline"]["bubble_fraction_total"]}


def evaluate_spec(spec: dict, cluster: dict) -> dict:
    """advisor_rules.terms() of one job-spec dict on a cluster {intra_GBps, inter_GBps, flops
    (gpt / mlp)}: what a sweep launched from the advisor stores as each member's prediction.
    Without a rate a gpt / mlp spec has no compute term (None figures). SpecError when the
    spec breaks a rule."""
    ev = _evaluate(json.dumps(spec, sort_keys=True), cluster["intra_GBps"],
                   cluster["inter_GBps"], cluster.get("flops"))
    if "invalid" in ev:
        raise SpecError([_err(["spec"], ev["invalid"])])
    return R.terms(ev)


def advise(model, global_batch, cluster, *, top: int = 20) -> dict:
    m = _model(model)
    if isinstance(global_batch, bool) or not isinstance(global_batch, int) or \
            not 1 <= global_batch <= 1_000_000:
        raise SpecError([_err(["global_batch"], "must be an integer between 1 and 1000000")])
    c = _cluster(cluster, m["arch"])
    if not isinstance(top, int) or isinstance(top, bool) or not 1 <= top <= 500:
        raise SpecError([_err(["top"], "must be an integer between 1 and 500")])
    counts = {"considered": 0, "pruned": {}, "invalid": {}, "not_fitting": 0, "fitting": 0}
    rows, status = [], {}
    for lay, pruned in enumerate_layouts(m, global_batch, c["hosts"], c["devices_per_host"]):
        counts["considered"] += 1
        key = R.label(lay)
        if pruned:
            counts["pruned"][pruned] = counts["pruned"].get(pruned, 0) + 1
            status[key] = ("divisibility", pruned)
            continue
        spec = spec_of(m, global_batch, c, lay)
        ev = _evaluate(json.dumps(spec, sort_keys=True), c["intra_GBps"], c["inter_GBps"],
                       c.get("flops"))
        if "invalid" in ev:
            counts["invalid"][ev["invalid"]] = counts["invalid"].get(ev["invalid"], 0) + 1
            status[key] = ("invalid", ev["invalid"])
            continue
        row = {"label": key, "layout": lay, "spec": spec,
               "predicted": {k: v for k, v in ev.items()}}
        if ev["memory_bytes"] > c["device_memory_bytes"]:
            counts["not_fitting"] += 1
            status[key] = ("memory", R.memory_reason(ev, c))
            row["reason"] = status[key][1]
            rows.append(row)
            continue
        counts["fitting"] += 1
        status[key] = ("fits", ev["step_s"])
        rows.append(row)
    fitting = sorted((r for r in rows if "reason" not in r), key=lambda r: r["predicted"]
                     ["step_s"])
    unfit = sorted((r for r in rows if "reason" in r),
                   key=lambda r: r["predicted"]["memory_bytes"])
    best = fitting[0] if fitting else None
    out = []
    for i, r in enumerate(fitting[:top]):
        r = copy.deepcopy(r)
        r["rank"] = i + 1
        r["rules"] = R.rules(r, c)
        r["why"] = R.why(r, best, c)
        r["neighbours"] = R.neighbours(r["layout"], status)
        out.append(r)
    return {"model": m, "global_batch": global_batch, "cluster": c,
            "conventions": R.conventions(m, c), "counts": counts, "candidates": out,
            "not_fitting": [{"label": r["label"], "spec": r["spec"], "reason": r["reason"],
                             "memory_bytes": r["predicted"]["memory_bytes"]}
                            for r in unfit[:5]]}
