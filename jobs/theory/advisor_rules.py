"""The advisor's explanations: seed 004's rules of thumb checked per candidate, why a candidate
ranks where it does, and what rules out its neighbours (docs/advisor.md). Standard library.
Figures read in scaled units (jobs.units, the dashboard's rule): a small model's step is
microseconds, and "8.192e-09 s" or "0.000137 GB" told a user nothing (issue 37)."""

from __future__ import annotations

from jobs.units import fmt

GB = 1e9
MAX_TP_RULE = 8  # seed 004: "张量并行 ... 一台机器内的 GPU，最多 8"
SEED = "seed 004"


def label(lay: dict) -> str:
    s = f"dp{lay['dp']}-tp{lay['tp']}-pp{lay['pp']}-z{lay['zero_stage']}"
    if lay["pp"] > 1:
        s += f"-{lay['pp_schedule']}"
    s += f"-m{lay['microbatches']}"
    for axis in ("ep", "cp"):
        if lay[axis] > 1:
            s += f"-{axis}{lay[axis]}"
    return s + ("-ckpt" if lay["activation_checkpointing"] else "")


def memory_reason(ev: dict, c: dict) -> str:
    comps = ev["memory_components"]
    big = max(comps, key=comps.get)
    return (f"memory: {fmt(ev['memory_bytes'], 'B')} per rank > device "
            f"{fmt(c['device_memory_bytes'], 'B')} (largest part: {big} "
            f"{fmt(comps[big], 'B')})")


def _s(v: float) -> str:
    return fmt(v, "s")


def _gbps(v: float) -> str:
    return fmt(v * GB, "B/s")


def _rule(name: str, status: str, why: str) -> dict:
    return {"rule": name, "status": status, "why": why}


def rules(r: dict, c: dict) -> list[dict]:
    """Seed 004's rules, each 'follows' / 'breaks' / 'n/a' with the figures behind it."""
    lay, p = r["layout"], r["predicted"]
    links, comm = p["links"], p["comm_s"]
    out = []
    tp = lay["tp"]
    if tp == 1:
        out.append(_rule("tp-inside-host", "n/a", "no tensor parallelism"))
    elif links["tp"] == "intra" and tp <= MAX_TP_RULE:
        out.append(_rule("tp-inside-host", "follows", f"tp = {tp} <= {MAX_TP_RULE}, its groups "
                         f"stay inside one host (intra link {_gbps(c['intra_GBps'])})"))
    else:
        why = (f"tp = {tp} spans hosts: its per-layer all-reduces run on the inter-host link "
               f"({_gbps(c['inter_GBps'])}), {_s(comm['tp'])} per step"
               if links["tp"] == "inter" else f"tp = {tp} > {MAX_TP_RULE}")
        out.append(_rule("tp-inside-host", "breaks", why))
    ep = lay["ep"]
    if ep > 1:  # seed 004: "tensor / expert parallel up to the GPUs of one machine, at most 8"
        inside = links.get("ep") == "intra" and ep <= MAX_TP_RULE
        out.append(_rule("ep-inside-host", "follows" if inside else "breaks",
                         f"ep = {ep}: its all-to-alls ({_s(comm.get('ep', 0.0))} per step) "
                         + ("stay inside one host" if inside else
                            f"run on the {links.get('ep')} link" +
                            (f" (ep > {MAX_TP_RULE})" if ep > MAX_TP_RULE else ""))))
    if c["hosts"] == 1:
        out.append(_rule("pp-across-hosts", "n/a", "one host"))
    elif lay["pp"] > 1 and links["pp"] == "inter" and links["tp"] == "intra":
        out.append(_rule("pp-across-hosts", "follows", f"pp = {lay['pp']} crosses hosts: only "
                         f"stage-boundary activations ({_s(comm['pp'])} per step) use the "
                         "inter-host link"))
    elif lay["pp"] > 1:
        out.append(_rule("pp-across-hosts", "breaks", f"pp = {lay['pp']} stays inside a host "
                         f"while {', '.join(a for a in ('tp', 'dp') if links[a] == 'inter')} "
                         "crosses hosts"))
    else:
        out.append(_rule("pp-across-hosts", "breaks" if links["dp"] == "inter" else "n/a",
                         "no pipeline: the model fits with tp / ZeRO alone; dp crosses hosts "
                         f"({_s(comm['dp'])} of dp traffic per step)"))
    z = lay["zero_stage"]
    if z == 3:
        link = links["dp"]
        status = "follows" if link == "intra" or c["inter_GBps"] >= c["intra_GBps"] / 4 \
            else "breaks"
        out.append(_rule("zero3-or-pp-by-bandwidth", status, f"ZeRO-3 moves 1.5x DDP's bytes "
                         f"on the {link} link ({_s(comm['dp'])} per step); rule of thumb: ZeRO-3 "
                         "instead of PP only where the bandwidth allows"))
    elif lay["pp"] > 1:
        out.append(_rule("zero3-or-pp-by-bandwidth", "follows", f"pipeline instead of ZeRO-3: "
                         f"bubble {_s(p['bubble_s'])} against ZeRO-3's extra gathers"))
    else:
        out.append(_rule("zero3-or-pp-by-bandwidth", "n/a", "neither PP nor ZeRO-3 needed"))
    out.append(_rule("dp-for-the-rest", "follows", f"dp = {lay['dp']}: the devices left after "
                     f"tp*pp = {tp * lay['pp']}" + (f", ZeRO-{z} shards over it" if z else "")))
    mb = r["spec"]["train"]["global_batch"] // (lay["dp"] // lay["cp"] *
                                                 lay["microbatches"])
    if lay["microbatches"] > 1:
        out.append(_rule("small-batch-grad-accum", "follows", f"{lay['microbatches']} "
                         f"micro-batches of {mb} samples per replica" +
                         (" (gradient accumulation)" if lay["pp"] == 1 else
                          " (fill the pipeline)")))
    else:
        out.append(_rule("small-batch-grad-accum", "n/a", f"one micro-batch of {mb} samples"))
    if lay["activation_checkpointing"]:
        out.append(_rule("recompute-for-larger-batch", "follows", "activation recomputation: "
                         "one extra forward (compute x 4/3) for activations of one block input "
                         "per layer"))
    return out


TERMS = ("compute_s", "bubble_s", "comm_s")


def terms(p: dict) -> dict:
    """The step-time breakdown of one evaluated layout (per rank per step), under the names the
    sweep page and jobs.theory.calibration compare with the measured headline."""
    return {"step_time_s": p["step_s"], "compute_s": p["compute_s"],
            "bubble_s": p["bubble_s"], "comm_s": sum(p["comm_s"].values())}


def why(r: dict, best: dict, c: dict) -> list[str]:
    p = r["predicted"]
    t = terms(p)
    axes = ", ".join(f"{a} {_s(v)} ({p['links'][a]})" for a, v in p["comm_s"].items() if v)
    head = (f"step {_s(p['step_s'])} = compute {_s(t['compute_s'])} + bubble "
            f"{_s(t['bubble_s'])} + exposed comm {_s(t['comm_s'])}" +
            (f" [{axes}]" if axes else "") + f"; memory {fmt(p['memory_bytes'], 'B')} of "
            f"{fmt(c['device_memory_bytes'], 'B')}")
    if r is best or r["label"] == best["label"]:
        return [head, "fastest predicted layout that fits"]
    bt = terms(best["predicted"])
    diff = {k: t[k] - bt[k] for k in TERMS}
    worst = max(diff, key=diff.get)
    gap = p["step_s"] - best["predicted"]["step_s"]
    return [head, f"{'+' if gap >= 0 else ''}{_s(gap)} against #1 ({best['label']}), mostly "
            f"{worst.removesuffix('_s')} ({'+' if diff[worst] >= 0 else ''}{_s(diff[worst])})"]


def _neighbour_layouts(lay: dict):
    def v(**kw):
        return {**lay, **kw}
    world = lay["dp"] * lay["tp"] * lay["pp"]
    for f in (2, 0.5):
        tp, pp = int(lay["tp"] * f), int(lay["pp"] * f)
        if tp >= 1 and lay["tp"] * f == tp and world % (tp * lay["pp"]) == 0:
            yield f"tp {lay['tp']} -> {tp}", v(tp=tp, dp=world // (tp * lay["pp"]))
        if pp >= 1 and lay["pp"] * f == pp and world % (pp * lay["tp"]) == 0:
            mb = max(pp, 1) if pp > 1 else 1
            sched = lay if pp > 1 else {"pp_schedule": "1f1b", "virtual_stages": 1}
            yield f"pp {lay['pp']} -> {pp}", v(pp=pp, dp=world // (pp * lay["tp"]),
                                               microbatches=mb if pp == 1 else
                                               lay["microbatches"],
                                               pp_schedule=sched["pp_schedule"],
                                               virtual_stages=sched["virtual_stages"])
    for z in (lay["zero_stage"] - 1, lay["zero_stage"] + 1):
        if 0 <= z <= 3:
            yield f"ZeRO {lay['zero_stage']} -> {z}", v(zero_stage=z)
    for mb in (lay["microbatches"] * 2, lay["microbatches"] // 2):
        if mb >= 1:
            yield f"microbatches {lay['microbatches']} -> {mb}", v(microbatches=mb)
    for axis in ("cp", "ep"):
        d = lay[axis]
        for c in (d * 2, d // 2):
            if c >= 1 and lay["dp"] % c == 0:
                yield f"{axis} {d} -> {c}", v(**{axis: c})
    yield ("recompute off" if lay["activation_checkpointing"] else "recompute on",
           v(activation_checkpointing=not lay["activation_checkpointing"]))


def neighbours(lay: dict, status: dict) -> list[dict]:
    """One-knob changes of this layout and what became of them (ruled out or slower)."""
    mine = status.get(label(lay))
    out = []
    for change, other in _neighbour_layouts(lay):
        st = status.get(label(other))
        if st is None:
            continue  # outside the search space (docs/advisor.md)
        kind, val = st
        if kind == "fits":
            if mine and mine[0] == "fits" and val > mine[1]:
                out.append({"change": change, "label": label(other), "status": "slower",
                            "reason": f"{_s(val)} predicted"})
            continue
        out.append({"change": change, "label": label(other), "status": kind, "reason": val})
    return out


def conventions(m: dict, c: dict) -> dict:
    if m["arch"] == "timed":
        compute = ("compute from the timed model's configured times, exact: rounds x layers/pp "
                   "x (t_forward + t_backward_input + t_backward_weight) "
                   "(jobs.theory.predict, step.per_rank_compute_s)")
    else:
        compute = (f"compute from FLOPs at {fmt(c['flops'], 'FLOP/s')} per device, "
                   f"{c.get('flops_source', 'given')} (jobs.theory.compute.training_flops), "
                   "split evenly over dp*tp*pp devices")
    return {"compute": compute,
            "step": "step = busy compute + pipeline bubble (schedule simulator) + Σ_axis comm "
                    "time on its link, no overlap of comm with compute (an upper bound of the "
                    "lower bounds)",
            "bandwidth": f"intra {_gbps(c['intra_GBps'])}, inter {_gbps(c['inter_GBps'])}, "
                         f"{c.get('bandwidth_source', 'given')} (busbw, jobs/theory/links.py)",
            "precision": "fp32 (model parallelism runs in fp32 only)",
            "memory": "jobs.theory.predict per_rank_bytes (busiest rank) <= device memory"}
