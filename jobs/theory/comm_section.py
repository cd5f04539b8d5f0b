"""predict()'s `comm` section: bytes per rank per step by mesh axis, and their time per link."""

from __future__ import annotations

from . import comm as C
from . import cp as CP
from . import links as L
from . import moe as M
from .figures import GB, fig
from .memory import MEMORY_MODELS


def comm_label(c: str) -> str:
    return {"ring-exact": "bytes each rank sends, exact nccl-tests factors (jobs/commbytes.py): "
            "DDP and ZeRO-1/2 2(N-1)/N*Ψ*b, ZeRO-3 1.5x",
            "asymptotic": "N -> inf limit: 2Ψ*b (DDP, ZeRO-1/2), 3Ψ*b (ZeRO-3)",
            "seed000-table": "seed 000's table: 2M baseline, 4M every ZeRO stage"}[c]



def comm_section(w: dict) -> dict:
    busiest = w["rank_params"].index(max(w["rank_params"]))
    psi_e = (w.get("rank_expert_params") or [0] * len(w["rank_params"]))[busiest]
    psi = w["rank_params"][busiest] - psi_e  # the DP strategy's parameters (experts: edp)
    gb = w["grad_bytes"] or MEMORY_MODELS[w["memory_model"]]["params"]
    conv = w["comm_convention"]
    label = comm_label(conv)
    dp = C.dp_bytes_per_rank(psi, w["dp"], w["zero_stage"], gb, w["dp_mode"], conv)
    ep_n = w.get("ep") or 1
    # expert gradients: summed over the expert-DP group (dp/ep ranks) by one all-reduce per
    # parameter (jobs/parallel/expert.py), whatever the ZeRO stage of the rest
    edp = C.dp_bytes_per_rank(psi_e, w["dp"] // ep_n, 0, gb, "ddp", conv)
    table = C.allreduce_algorithms(w["dp"], psi * gb)
    algo = w["allreduce_algorithm"]
    if w["zero_stage"] == 0 and w["dp_mode"] != "ps" and algo != "ring" and w["dp"] > 1:
        row = next(r for r in table if r["algorithm"] == algo)
        dp = {**dp, "value": row["max_per_worker"],
              "formula": f"{algo} all-reduce, busiest worker (seed 000 table)"}
    rounds = w["microbatches"] * w["grad_accum"]
    act_bytes = w["act_bytes"] or (4 if w["memory_model"] == "fp32" else 2)
    tp = pp = {"value": 0.0, "formula": "0", "ops": []}
    s = w["seq_len"] or 1
    if w["tp"] > 1 and None not in (w["hidden"], w["micro_batch_size"], w["layers"]):
        tp = C.tp_bytes_per_microbatch(s, w["micro_batch_size"], w["hidden"],
                                       w["layers"] // w["pp"], w["tp"], act_bytes,
                                       w["sequence_parallel"], w["activation_checkpointing"])
    elif w["tp"] > 1:
        tp = {"value": 0.0, "formula": "not modeled: give hidden, micro_batch_size, layers "
              "(and seq_len)", "ops": []}
    if w["pp"] > 1 and None not in (w["hidden"], w["micro_batch_size"]):
        elems = s * w["micro_batch_size"] * w["hidden"] / \
            (w["tp"] if w["sequence_parallel"] else 1)
        pp = C.pp_bytes_per_microbatch(elems, act_bytes, w["pp"], w["virtual_stages"])
    elif w["pp"] > 1:
        pp = {"value": 0.0, "formula": "not modeled: give hidden, micro_batch_size (and seq_len)",
              "ops": []}
    ep = _ep(w, rounds, act_bytes)
    comps = {"dp": dp["value"], "tp": tp["value"] * rounds, "pp": pp["value"] * rounds}
    if ep_n > 1:  # the axes exist with expert parallelism only (keys stay as before without)
        comps.update(ep=ep["value"], edp=edp["value"])
    cp_n = w.get("cp") or 1
    ring = None
    if cp_n > 1:  # the axis exists with context parallelism only: ring attention's sends
        ring = CP.ring_bytes(batch=w["cp_batch"], seq_len=s, hidden=w["hidden"], cp=cp_n,
                             act_bytes=act_bytes, tp=w["tp"])
        comps["cp"] = CP.step_ring_bytes(layers=w["layers"] // w["pp"], rounds=rounds,
                                         micro_batch=w["cp_batch"], seq_len=s,
                                         hidden=w["hidden"], cp=cp_n, act_bytes=act_bytes,
                                         tp=w["tp"])
    total = sum(comps.values())
    links = L.links_section(w, comps)
    t = links["time_s"] if L.has_bandwidth(w) else None
    by_stage = {str(z): C.dp_bytes_per_rank(psi, w["dp"], z, gb, "ddp", conv)["value"]
                for z in range(4)}
    explain = {
        "bytes_per_rank": fig(total, "bytes", " + ".join(comps), comps, label),
        "components.dp": fig(dp["value"], "bytes", dp["formula"], dp["inputs"], label),
        "components.tp": fig(comps["tp"], "bytes", f"microbatches*grad_accum x [{tp['formula']}]",
                             {"rounds": rounds}, label),
        "components.pp": fig(comps["pp"], "bytes", f"microbatches*grad_accum x [{pp['formula']}]",
                             {"rounds": rounds}, label),
        "time_lower_bound_s": fig(t, "s", "Σ_axis bytes_axis / (busbw of the axis' link*1e9) "
                                  "(= bytes_per_rank / (bandwidth_GBps*1e9) with one "
                                  "bandwidth)" if t is not None else "needs bandwidth_GBps (or "
                                  "intra_ / inter_bandwidth_GBps)",
                                  {"bytes_per_rank": total, "bandwidth_GBps":
                                   w["bandwidth_GBps"], **{f"{k}_busbw_GBps": v["busbw_GBps"]
                                                           for k, v in
                                                           links["per_link"].items()}},
                                  "one-direction bus bandwidth per link; latency ignored; "
                                  + L.CONVENTION),
    }
    if ring is not None:
        explain["components.cp"] = fig(comps["cp"], "bytes", "layers/pp x microbatches*"
                                       f"grad_accum x [{ring['formula']}]",
                                       {"block_bytes": ring["block"], "cp": cp_n,
                                        "rounds": rounds, "cp_batch": w["cp_batch"]},
                                       CP.CONVENTION + ": bytes each CP rank sends per step")
    if ep_n > 1:
        explain["components.ep"] = fig(ep["value"], "bytes", ep["formula"], ep["inputs"],
                                       EP_CONVENTION)
        explain["components.edp"] = fig(edp["value"], "bytes", edp["formula"].replace(
            "Ψ", "Ψ_experts_rank").replace("N", "N_edp"), {**edp["inputs"],
                                                        "N_edp = dp/ep": w["dp"] // ep_n},
            label + "; expert gradients all-reduced over the expert-DP group")
    for r in links["per_axis"]:
        if r["bytes_per_rank"]:
            explain[f"links.{r['axis']}.time_s"] = fig(
                r["time_s"], "s", f"{r['axis']} bytes per rank / ({r['link']} busbw*1e9)",
                {"bytes_per_rank": r["bytes_per_rank"], "link": r["link"],
                 "busbw_GBps": r["busbw_GBps"], "bandwidth": r["bandwidth_source"],
                 "groups_crossing": f"{r['groups_crossing']} of {r['groups']}"}, L.CONVENTION)
    return {"bytes_per_rank": total, "GB_per_rank": total / GB, "time_lower_bound_s": t,
            "components": comps, "links": links, "convention": conv,
            "per_microbatch": {"tp": tp["value"], "pp": pp["value"],
                               "tp_recompute": tp.get("recompute_value", 0.0)},
            "dp_ops": [list(o) for o in dp["ops"]], "tp_ops_per_microbatch":
            [list(o) for o in tp["ops"]], "pp_ops_per_microbatch": [list(o) for o in pp["ops"]],
            "dp_by_zero_stage": by_stage, "allreduce_algorithms": table,
            "ep": ep if ep_n > 1 else None, "explain": explain}


EP_CONVENTION = ("uniform-routing: every expert gets N*top_k/E assignments per capacity group "
                 "of N tokens (a rank's micro-batch, or a sequence with capacity_scope "
                 "'sequence'), so a rank keeps A = min(T*k, groups*E*C) assignments (capacity "
                 "dropping bound; the expected drops of random routing are predict()'s `moe`) "
                 "and "
                 "sends (ep-1)/ep of its dispatch / combine rows; the group's payload "
                 "4*A*h*act_bytes per block (group-payload) and the counts are exact given the "
                 "drops (jobs.theory.moe.a2a_bytes)")


def _ep(w: dict, rounds: int, act_bytes: float) -> dict:
    """Expert parallelism's all-to-all bytes per rank per step (jobs.theory.moe)."""
    if (w.get("ep") or 1) <= 1:
        return {"value": 0.0, "formula": "0", "inputs": {}}
    return M.ep_bytes_per_rank(tokens=w["micro_batch_size"] * w["seq_len"], hidden=w["hidden"],
                               top_k=w["top_k"], experts=w["experts"], ep=w["ep"],
                               seq_len=w["seq_len"], capacity_factor=w["capacity_factor"],
                               act_bytes=act_bytes, layers=w["layers"], rounds=rounds,
                               capacity_scope=w.get("capacity_scope", "rank"))
