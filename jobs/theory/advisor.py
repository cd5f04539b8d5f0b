"""The advisor: every layout of a model on a cluster that the service accepts and that fits in
device memory, ranked by predicted step time (docs/advisor.md).

advise(model, global_batch, cluster, top=20, fix=None, budget=None, compare_to=None) -> dict
    model    {"preset": NAME, ...field overrides} or explicit fields of jobs.spec.ModelSpec
             (arch, layers, hidden, heads, seq_len, vocab; timed: t_forward, t_backward_input,
             t_backward_weight)
    cluster  {"hosts", "devices_per_host", "device_memory_bytes", "intra_GBps", "inter_GBps",
             "flops" (FLOP/s per device; needed for gpt / mlp), "flops_source" (text, optional),
             "bandwidth_source" (text, optional), "queue" (optional: runtime.queue of the specs)}
    fix      {"tp", "pp", "microbatches", "zero_stage", "cp", "ep"}: only layouts with these
             degrees are searched (each optional)
    budget   jobs.theory.budget.Budget: the search is counted first and refused (SpecError,
             type search_budget) when it is over a bound, before any layout is evaluated; the
             second pass (smaller micro-batches where none of the searched counts fits,
             memory_first) is counted before it runs and skipped, said so, when over a bound
    compare_to  [{tp, pp, dp, micro_batch_size, pp_schedule?, virtual_stages?, zero_stage?,
             activation_checkpointing?, cp?, ep?}]: layouts placed in the ranking (answer's
             `compare_to`: breakdown and rank, or the reason they do not fit)
Every candidate is a spec dict validated by jobs.spec.parse_spec (require_available, as at
submit) and predicted by jobs.theory.predict; the compute term is jobs.theory.compute's.
Invalid input raises SpecError naming the field. Standard library only.
"""

from __future__ import annotations

import copy
import json
from functools import lru_cache

from jobs.spec import SpecError, parse_spec

from . import advisor_rules as R
from .advisor_input import (  # noqa: F401 (CLUSTER_RULES, FIX_KEYS: part of the API)
    CLUSTER_RULES,
    FIX_KEYS,
    MAX_TP,
    MODEL_KEYS,
    MOE_KEYS,
    _err,
    check_request,
)
from .budget import Budget, search_size
from .bytecache import CACHE_BYTES, ByteLRU
from .compute import training_flops
from .predict import SIMULATED, predict

# (schedule, virtual stages) tried for pp > 1; naive is GPipe with m = 1, always dominated
SCHEDULES = (("1f1b", 1), ("gpipe", 1), ("interleaved", 2), ("zero-bubble", 1), ("zbv", 2))
# (parse, predict) of each spec evaluated, in bytes: the page re-asks the same cluster often
EVALUATED = ByteLRU(CACHE_BYTES)


def configure_caches(max_bytes: int) -> None:
    """The bound, in bytes, of each of the theory's memos (evaluations and simulations)."""
    EVALUATED.resize(max_bytes)
    SIMULATED.resize(max_bytes)


def cache_stats() -> dict:
    return {"evaluations": EVALUATED.stats(), "simulations": SIMULATED.stats()}


@lru_cache(maxsize=1024)
def _divisors(n: int) -> tuple[int, ...]:
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return tuple(sorted(set(small + [n // d for d in small])))


def enumerate_layouts(m: dict, batch: int, hosts: int, per_host: int, fix: dict | None = None):
    """Yield (layout, pruned_reason | None): the search space (only the degrees `fix` leaves
    open), pruned by divisibility before any spec is built (the spec validator re-checks every
    survivor)."""
    fix = fix or {}
    world = hosts * per_host
    for tp in _divisors(world):
        if tp > MAX_TP or fix.get("tp", tp) != tp:
            continue
        for pp in _divisors(world // tp):
            if fix.get("pp", pp) != pp:
                continue
            dp = world // (tp * pp)
            for lay in _variants(m, dp, tp, pp, fix):
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


def _variants(m: dict, dp: int, tp: int, pp: int, fix: dict):
    def keep(key, values):
        return tuple(x for x in values if fix.get(key, x) == x)

    scheds = SCHEDULES if pp > 1 else (("1f1b", 1),)
    micro = keep("microbatches", (pp, 2 * pp, 4 * pp) if pp > 1 else (1, 2, 4, 8))
    ckpts = (False, True) if m["arch"] == "gpt" else (False,)
    cps = keep("cp", (1,) if m["experts"] else _cps(m, dp))  # CP with MoE: refused (jobs.spec)
    for cp in cps:
        for ep in keep("ep", _eps(m, dp)):
            for zero in keep("zero_stage", range(4) if dp > 1 else (0,)):
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


def _evaluate(spec_json: str, intra: float, inter: float, flops: float | None) -> dict:
    """(parse, predict) of one spec, memoised in EVALUATED (do not mutate the answer)."""
    key = (spec_json, intra, inter, flops)
    got = EVALUATED.get(key)
    if got is None:
        got = _evaluated(spec_json, intra, inter, flops)
        EVALUATED.put(key, got)
    return got


def _evaluated(spec_json: str, intra: float, inter: float, flops: float | None) -> dict:
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


# micro-batch sizes tried, memory first, for a layout none of whose searched counts fits
SMALL_MICRO = (4, 2, 1)


def _shape_key(lay: dict) -> tuple:
    return tuple(sorted((k, v) for k, v in lay.items() if k != "microbatches"))


def memory_first(m: dict, batch: int, shapes: dict, tried: dict, asked=()):
    """Yield (layout, pruned | None): the second pass of the search (docs/advisor.md
    "Micro-batch sizes"). `shapes`: layout shape (all but the micro-batch count) -> (a layout
    of it the first pass enumerated, whether any of its counts fit). For every shape that did
    not fit at any count the first pass evaluated (or had all of them pruned), the counts of
    micro-batch size 4, 2 and 1 (per data-parallel replica) that give smaller micro-batches
    than the first pass evaluated (activation memory falls with the micro-batch, the model
    states do not); for every shape,
    the counts a request asks for (compare_to) that the first pass did not try."""
    for key, (lay, fits) in shapes.items():
        replica = batch // (lay["dp"] // lay["cp"])
        small = set() if fits else {replica // b for b in SMALL_MICRO if replica % b == 0}
        counts = {c for c in small if c > max(tried[key], default=0)} | set(asked)
        for mb in sorted(counts - set(tried[key])):
            new = {**lay, "microbatches": mb}
            yield new, _pruned(m, batch, new)


def _compare_variants(m: dict, lay: dict):
    """The full layouts of one compare_to entry: what it leaves out, every value."""
    dp = lay["dp"]
    zeros = (lay["zero_stage"],) if "zero_stage" in lay else (range(4) if dp > 1 else (0,))
    ckpts = (lay["activation_checkpointing"],) if "activation_checkpointing" in lay else \
        ((False, True) if m["arch"] == "gpt" else (False,))
    sched = lay.get("pp_schedule", "1f1b")
    for zero in zeros:
        for ck in ckpts:
            full = {"dp": dp, "tp": lay["tp"], "pp": lay["pp"], "zero_stage": zero,
                    "pp_schedule": sched, "virtual_stages": lay.get("virtual_stages", 1),
                    "microbatches": lay["microbatches"], "activation_checkpointing": ck,
                    "cp": lay.get("cp", 1), "ep": lay.get("ep", 1)}
            if (full["cp"] > 1 or full["ep"] > 1) and (ck or zero == 3):
                continue
            yield full, None


def _total(*sizes) -> dict:
    return {k: sum(sz[k] for sz in sizes) for k in ("layouts", "candidates", "sim_actions")} | {
        "complete": all(sz["complete"] for sz in sizes)}


def advise(model, global_batch, cluster, *, top: int = 20, fix=None,
           budget: Budget | None = None, compare_to=None) -> dict:
    m, c, fixed, compare = check_request(model, global_batch, cluster, top, fix,
                                         compare_to or [])
    space = (m, global_batch, c["hosts"], c["devices_per_host"], fixed)
    size = search_size(enumerate_layouts(*space), budget)
    asked = [[(lay, _pruned(m, global_batch, lay)) for lay, _ in _compare_variants(m, cl)]
             for cl in compare]
    asked_size = search_size((x for v in asked for x in v), budget)
    if budget is not None:
        budget.check(_total(size, asked_size))  # before any layout is evaluated
    counts = {"considered": 0, "pruned": {}, "invalid": {}, "not_fitting": 0, "fitting": 0}
    rows, status, tried, shapes = [], {}, {}, {}

    def place(lay, pruned, counts):
        counts["considered"] += 1
        key = R.label(lay)
        if pruned:
            counts["pruned"][pruned] = counts["pruned"].get(pruned, 0) + 1
            status[key] = ("divisibility", pruned)
            return None
        spec = spec_of(m, global_batch, c, lay)
        ev = _evaluate(json.dumps(spec, sort_keys=True), c["intra_GBps"], c["inter_GBps"],
                       c.get("flops"))
        if "invalid" in ev:
            counts["invalid"][ev["invalid"]] = counts["invalid"].get(ev["invalid"], 0) + 1
            status[key] = ("invalid", ev["invalid"])
            return None
        row = {"label": key, "layout": lay, "spec": spec,
               "predicted": {k: v for k, v in ev.items()}}
        if ev["memory_bytes"] > c["device_memory_bytes"]:
            counts["not_fitting"] += 1
            status[key] = ("memory", R.memory_reason(ev, c))
            row["reason"] = status[key][1]
        else:
            counts["fitting"] += 1
            status[key] = ("fits", ev["step_s"])
        return row

    for lay, pruned in enumerate_layouts(*space):
        row = place(lay, pruned, counts)
        shape = _shape_key(lay)
        tried.setdefault(shape, [])
        if pruned:  # a shape all of whose counts are pruned gets the second pass too
            shapes.setdefault(shape, (lay, False))
            continue
        tried[shape].append(lay["microbatches"])
        if row is None:  # the spec refuses it
            continue
        rows.append(row)
        fits = "reason" not in row or shapes.get(shape, (None, False))[1]
        shapes[shape] = (shapes.get(shape, (lay,))[0], fits)
    # second pass, memory first: smaller micro-batches where the searched counts do not fit,
    # and the counts compare_to asks for; counted against the budget before it is evaluated
    user_counts = sorted({cl["microbatches"] for cl in compare})
    if fixed.get("microbatches"):
        user_counts = []  # a fixed count is the only one searched
    second = list(memory_first(m, global_batch, shapes, tried, user_counts))
    second_size = search_size(iter(second))
    over = None
    if budget is not None:
        try:
            budget.check(_total(size, asked_size, second_size))
        except SpecError as exc:
            over = exc.errors[0]["msg"]
    smaller = {"considered": 0, "pruned": {}, "invalid": {}, "not_fitting": 0, "fitting": 0}
    if over is None:
        for lay, pruned in second:
            row = place(lay, pruned, smaller)
            if row is not None:
                rows.append(row)
    fitting = sorted((r for r in rows if "reason" not in r), key=lambda r: r["predicted"]
                     ["step_s"])
    unfit_rows = sorted((r for r in rows if "reason" in r),
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
    placed = []
    for cl, variants in zip(compare, asked, strict=True):
        tally = {"considered": 0, "pruned": {}, "invalid": {}, "not_fitting": 0, "fitting": 0}
        got = [place(lay, pr, tally) for lay, pr in variants]
        placed.append(_place_compare(cl, got, fitting, best, c, tally))
    search = {k: size[k] for k in ("layouts", "candidates", "sim_actions")}
    search["smaller_micro_batches"] = {
        "shapes_unfit": sum(1 for _, f in shapes.values() if not f),
        **{k: second_size[k] for k in ("layouts", "candidates", "sim_actions")},
        "ran": over is None, "skipped": over, "counts": smaller}
    answer = {"model": m, "global_batch": global_batch, "cluster": c, "fix": fixed,
              "search": search, "conventions": R.conventions(m, c), "counts": counts,
              "candidates": out,
              "not_fitting": [{"label": r["label"], "spec": r["spec"], "reason": r["reason"],
                               "memory_bytes": r["predicted"]["memory_bytes"]}
                              for r in unfit_rows[:5]]}
    if compare_to is not None:
        answer["compare_to"] = placed
    return answer


def _place_compare(asked: dict, rows: list, fitting: list, best, c: dict, tally: dict) -> dict:
    """One compare_to layout placed: its best fitting variant (over what it left out) with
    its breakdown and rank among the search's fitting layouts (1 + those strictly faster),
    else the reason none fits (the smallest-memory variant's, or the spec rule it breaks)."""
    got = [r for r in rows if r is not None]
    fits = sorted((r for r in got if "reason" not in r), key=lambda r: r["predicted"]["step_s"])
    out = {"asked": {k: v for k, v in asked.items() if k != "microbatches"},
           "microbatches": asked["microbatches"], "of": len(fitting)}
    if fits:
        r = copy.deepcopy(fits[0])
        step = r["predicted"]["step_s"]
        r["rank"] = 1 + sum(1 for f in fitting if f["predicted"]["step_s"] < step)
        r["why"] = R.why(r, best or r, c)
        return {**out, **r, "reason": None}
    if got:
        r = copy.deepcopy(min(got, key=lambda r: r["predicted"]["memory_bytes"]))
        return {**out, **r, "rank": None}
    why = sorted(set(tally["pruned"]) | set(tally["invalid"]))
    return {**out, "rank": None, "reason": "no valid variant: " + "; ".join(why)}
