"""predict(): memory, communication, step time and pipeline bubble of one configuration."""

from __future__ import annotations

from jobs import schedules
from jobs.spec import JobSpec, SpecError, parse_spec

from .bytecache import CACHE_BYTES, ByteLRU
from .comm_section import comm_label, comm_section
from .figures import GB, fig
from .memory import MEMORY_MODELS, ZERO_FORMULAS, zero_table
from .model import gpt_activation_bytes_per_layer, simple_activation_bytes_per_layer
from .ranks import rank_memory, state_bytes
from .whatif import inputs_from_spec, parse_whatif

UNITS = "decimal GB = 1e9 bytes; bandwidth in GB/s = 1e9 bytes/s (as the seeds use)"
MAX_SIM_ACTIONS = 200_000
TRANSIENT = {  # labelled next to the model states (jobs/theory/ranks.py)
    "recv_buffers": "pipeline receive buffers alive at once (one posted ahead per direction)",
    "gathered_unit": "ZeRO-3 / FSDP transient gather (seed 003: check the temporary peak)",
    "comm_buffers": "data-parallel collective buffers the implementation allocates",
}
GATHERED_CONVENTION = (
    "what the spec's engine holds (jobs/theory/gathered.py): the reference Zero3 or FSDP2's "
    "fully_shard with its backward prefetch, flat all-gather buffers and retained reduce-scatter "
    "input, measured per op on CPU (jobs/parallel/fsdp_meter.py); DeepSpeed's estimator counts "
    "4 bytes x the largest single module instead (estimate_zero3_model_states_mem_needs)")


# The simulator is pure and predict() reads a few figures of its result: those are memoised
# (not the spans, ~400 bytes per action), in bytes (issue 36), because the advisor (advisor.py)
# predicts thousands of layouts sharing a few (schedule, p, m, v, times).
SIMULATED = ByteLRU(CACHE_BYTES)
_RANK_KEYS = ("rank", "busy_s", "idle_s", "idle_fraction", "idle_over_busy",
              "peak_inflight_microbatches")


def _simulate(sched: str, p: int, m: int, v: int, tf: float, tb: float, tw: float) -> dict:
    key = (sched, p, m, v, tf, tb, tw)
    got = SIMULATED.get(key)
    if got is None:
        full = schedules.simulate(sched, p, m, v, tf, tb, tw)
        got = {"makespan_s": full["makespan_s"], "bubble_fraction": full["bubble_fraction"],
               "bubble_over_ideal": full["bubble_over_ideal"],
               "ranks": [{k: r[k] for k in _RANK_KEYS} for r in full["ranks"]]}
        SIMULATED.put(key, got)
    return got


def _idle(sched: str, p: int, m: int, v: int, tf: float, tb: float, tw: float) -> float:
    """The simulated schedule's largest per-rank idle time."""
    return max(r["idle_s"] for r in _simulate(sched, p, m, v, tf, tb, tw)["ranks"])


def simulated_microbatches(sched: str, p: int, m: int, v: int) -> int | None:
    """How many micro-batches predict() hands the schedule simulator for this pipeline (it
    then runs p*that*v*3 actions at most), or None when it uses a closed form or an estimate
    instead: the one rule _pipeline follows and the advisor's budget counts."""
    if p == 1:
        return None
    if p * m * v * 3 <= MAX_SIM_ACTIONS:
        return m
    if schedules.closed_form_bubble(sched, p, m, v, "total") is not None:
        return None
    if sched == "zbv" and m >= 2 * p - 1 and p * (2 * p - 1) * v * 3 <= MAX_SIM_ACTIONS:
        return 2 * p - 1  # ZB-V's idle is constant in m from 2p-1 on (_pipeline)
    if sched == "zbv" and m < 2 * p - 1 and MAX_SIM_ACTIONS // (p * v * 3) >= 1:
        return MAX_SIM_ACTIONS // (p * v * 3)  # the most it can simulate: zbv_idle_between
    return None


def zbv_idle_between(p: int, m: int, m_lo: int, idle_lo: float, plateau: float) -> float:
    """ZB-V idle for m_lo < m < 2p-1 (too many actions to simulate at m): linear from the
    simulated idle_lo at m_lo to the plateau at 2p-1 (zbv_idle), monotone in m and exact at both
    ends. Where the idle never grows with m (zbv_monotone) the exact idle lies between the two
    ends, so the error is at most the distance to the farther one."""
    assert m_lo < m < 2 * p - 1
    return idle_lo + (plateau - idle_lo) * (m - m_lo) / (2 * p - 1 - m_lo)


def zbv_monotone(tf: float, tb: float, tw: float) -> bool:
    """Whether ZB-V's idle never grows with m up to its plateau for these stage times, checked
    by the simulator at p = 6 and 8 (it is not so everywhere: with t_W > t_B, e.g. (1, 1, 3),
    the idle falls, then climbs back to the plateau over the last micro-batches before 2p-1)."""
    for p in (6, 8):
        idle = [_idle("zbv", p, m, 2, tf, tb, tw) for m in range(1, 2 * p)]
        if any(b > a + 1e-9 for a, b in zip(idle, idle[1:], strict=False)):
            return False
    return True


def zb_h1_idle(p: int, m: int, tf: float, tb: float, tw: float) -> float:
    """Idle time of every rank of ZB-H1 ("zero-bubble", jobs/schedules.py) with the same
    t_F, t_B, t_W on every stage: (p-1)(t_F + t_B) - (min(m, p) - 1) * min(t_F, t_B, t_W).

    For m >= p that is (p-1) * max(t_F, t_B, t_F + t_B - t_W), the longest of three paths
    through the schedule (docs/conventions.md 'zb-h1-bubble'): F_0 up the pipeline, then the
    last rank never waits, (p-1) t_F; F_0 up and B_0 down to rank 0, which then never waits,
    (p-1) t_B; F_0 up, the last rank busy up to B_{m-1}, B_{m-1} down and rank 0's W_{m-1},
    (p-1)(t_F + t_B - t_W). Qi et al. 2023's (p-1)(t_F + t_B - t_W) is the third, which is
    the longest only while t_W <= min(t_F, t_B). Equal to the simulator's idle for every m."""
    return (p - 1) * (tf + tb) - (min(m, p) - 1) * min(tf, tb, tw)


def zbv_idle(p: int, tf: float, tb: float, tw: float) -> float:
    """Idle time of every rank of ZB-V ("zbv") with m >= 2p-1 micro-batches and the same chunk
    times on every stage. It does not depend on m from 2p-1 on, and it is linear in p
    (docs/conventions.md 'zbv-bubble'): simulate p = 3 and 4 at m = 2p-1 (a few dozen
    actions) and extrapolate. Used where p*(2p-1)*6 actions are too many to simulate."""
    a, b = _idle("zbv", 3, 5, 2, tf, tb, tw), _idle("zbv", 4, 7, 2, tf, tb, tw)
    return a + (p - 3) * (b - a)


EP_STATE = "convention 'ep-state': reference EP, experts not ZeRO-sharded"
ACT_CONVENTION = ("saved tensors as autograd keeps them (jobs.memory.SavedTensorCounter) for "
                  "paralab's GPT; Megatron (Korthikanti et al. 2022) estimate, 2-byte "
                  "activations scaled by act_bytes/2, with checkpointing or a vocab-parallel "
                  "head; MoE blocks: convention 'uniform-routing' (every expert gets "
                  "s*top_k/E assignments per sequence, kept A = min(T*k, b*E*C))")


def predict(obj, **overrides) -> dict:
    """Theory for a JobSpec, a job-spec dict (or preset), or a what-if dict with `params`.

    `overrides` (JobSpec only): what-if fields such as bandwidth_GBps, compute_ms,
    bubble_convention, comm_convention, memory_model. Raises SpecError (a ValueError) with
    FastAPI-shaped errors on invalid input."""
    if isinstance(obj, dict) and "params" not in obj:
        obj = parse_spec(obj, max_world_size=1 << 30)
    if isinstance(obj, JobSpec) and obj.kind == "collective_bench":
        return _collective(obj)
    if isinstance(obj, JobSpec):
        w, kind = inputs_from_spec(obj, overrides), "spec"
        w["engine"] = obj.parallel.engine  # the gathered unit is the engine's (gathered.py)
        w["router_bias"] = obj.model.router_bias  # the routing the drops follow (moe.py)
    elif isinstance(obj, dict) and "params" in obj:
        if overrides:
            raise TypeError("overrides only apply to a JobSpec; put them in the what-if dict")
        w, kind = parse_whatif(obj), "whatif"
        share = 1 / (w["tp"] * w["pp"])
        w["rank_params"] = [w["params"] * share] * w["pp"]
        w["rank_expert_params"] = [0] * w["pp"]  # a what-if has no experts (ep = 1)
    else:
        raise SpecError([{"loc": [], "msg": "must be a job spec or a what-if object with "
                          "'params'", "type": "dict_type"}])
    return _predict(w, kind)


# Scratch per rank of each all-reduce algorithm, in units of S (jobs/comm/allreduce.py).
_SCRATCH = {"builtin": lambda n: 0.0, "naive": lambda n: float(n), "ps": lambda n: n - 1.0,
            "ring": lambda n: 2.0 / n, "tree": lambda n: 1.0, "butterfly": lambda n: 1.0}


def _collective(spec: JobSpec) -> dict:
    """A collective sweep has no model. Per rank it holds the largest message three times
    (input, working copy, expected result for the in-place check) plus the scratch of the
    hungriest selected algorithm (naive N*S, parameter server (N-1)*S, ring 2S/N, tree and
    butterfly S); nccl-tests' S is the whole logical array."""
    c, n = spec.collective, spec.world_size
    algos = c.algorithms if "all_reduce" in c.ops else ("builtin",)
    scratch = max(_SCRATCH[a](n) for a in algos)
    buf = (3.0 + scratch) * c.max_bytes
    comps = {"params": 0.0, "grads": 0.0, "optimizer": 0.0, "activations": 0.0, "buffers": buf}
    f = fig(buf, "bytes", "(3 + scratch(algorithm, N)) * collective.max_bytes",
            {"max_bytes": c.max_bytes, "world_size": n, "algorithms": list(algos),
             "scratch_in_S": scratch}, "nccl-tests: S = whole logical array")
    return {"kind": "collective_bench", "inputs": {"world_size": n},
            "conventions": {"units": UNITS},
            "memory": {"per_rank_bytes": buf, "per_rank_GB": buf / GB, "components": comps,
                       "model_state_bytes": 0.0, "explain": {"per_rank_bytes": f}},
            "comm": None, "step": None, "pipeline": None}


def _predict(w: dict, kind: str) -> dict:
    from .moe import moe_prediction
    pipe = _pipeline(w)
    mem = _memory(w, pipe)
    com = comm_section(w)
    step = _step(w, pipe, com)
    conv = {"memory_model": MEMORY_MODELS[w["memory_model"]]["label"],
            "bubble": pipe["convention"], "comm": comm_label(w["comm_convention"]),
            "units": UNITS}
    inputs = {k: v for k, v in w.items() if k not in ("rank_params", "rank_expert_params")}
    return {"kind": kind, "inputs": inputs, "conventions": conv,
            "params": {"total": w["params"], "per_rank": max(w["rank_params"]),
                       "per_pipeline_rank": w["rank_params"]},
            "memory": mem, "comm": com, "step": step, "pipeline": pipe,
            "moe": moe_prediction(w)}


# --- pipeline ------------------------------------------------------------------------------------

def _stage_times(w: dict) -> tuple[float, float, float, str]:
    if w["t_f"] is not None or w["t_b_input"] is not None or w["t_b_weight"] is not None:
        return (w["t_f"] or 0.0, w["t_b_input"] or 0.0, w["t_b_weight"] or 0.0,
                "given per-stage times")
    if w["compute_ms"]:
        n = w["dp"] * w["tp"] * w["pp"] * w["microbatches"] * w["virtual_stages"] * \
            w["grad_accum"]
        t = w["compute_ms"] / 1000 / n / 3
        return t, t, t, "compute_ms split per stage and micro-batch, t_f = t_b_input = t_b_weight"
    return 1.0, 1.0, 1.0, "unit times t_f = t_b_input = t_b_weight = 1"


def _pipeline(w: dict) -> dict:
    p, m, v, sched = w["pp"], w["microbatches"], w["virtual_stages"], w["pp_schedule"]
    conv = w["bubble_convention"]
    label = ("over total time: idle / step time, (p-1)/(v*m+p-1)" if conv == "total" else
             "over ideal time: idle / busy time, (p-1)/(v*m) (seeds 000, 004: (p-1)/m)")
    if p == 1:
        return {"schedule": None, "p": 1, "m": m, "v": v, "bubble_fraction": 0.0,
                "bubble_fraction_total": 0.0, "bubble_fraction_ideal": 0.0,
                "convention": label, "source": "no pipeline", "simulation": None,
                "explain": {"bubble_fraction": fig(0.0, "fraction", "0 (pp = 1)", {"p": 1},
                                                   label)}}
    tf, tb, tw, times_note = _stage_times(w)
    closed_t = schedules.closed_form_bubble(sched, p, m, v, "total")
    closed_i = schedules.closed_form_bubble(sched, p, m, v, "ideal")
    sim, m_sim = None, simulated_microbatches(sched, p, m, v)
    if m_sim == m:
        full = _simulate(sched, p, m, v, tf, tb, tw)
        sim = {"makespan_s": full["makespan_s"], "times_note": times_note,
               "times": {"t_f": tf, "t_b_input": tb, "t_b_weight": tw},
               "ranks": [dict(r) for r in full["ranks"]]}
        total, ideal = full["bubble_fraction"], full["bubble_over_ideal"]
        source = "schedule simulator (jobs/schedules.py)"
    elif closed_t is not None:
        total, ideal, source = closed_t, closed_i, "closed form"
    elif m_sim is not None and m < 2 * p - 1:  # ZB-V, p > ~129: simulated at m_sim < m
        lo = _idle(sched, p, m_sim, v, tf, tb, tw)
        plateau = zbv_idle(p, tf, tb, tw)
        idle = zbv_idle_between(p, m, m_sim, lo, plateau)
        busy = v * m * (tf + tb + tw)
        total, ideal = idle / (busy + idle), idle / busy
        source = (f"between the schedule simulator at m = {m_sim} and ZB-V's plateau at "
                  "m = 2p-1, linear: ")
        if zbv_monotone(tf, tb, tw):
            source += f"idle within ±{max(lo - idle, idle - plateau):.6g} s (never grows with m)"
        else:
            source += "an estimate, unbounded (with these times the idle dips below the plateau)"
    elif m_sim is not None:
        # ZB-V with equal stages: the idle per rank stops growing once m >= 2p-1 (the steady
        # phase adds no bubble), so simulate m = 2p-1 and add the extra micro-batches' work
        idle = _idle(sched, p, m_sim, v, tf, tb, tw)
        busy = v * m * (tf + tb + tw)
        total, ideal = idle / (busy + idle), idle / busy
        source = "schedule simulator at m = 2p-1, extrapolated (ZB-V idle is constant in m)"
    elif sched == "zbv" and m >= 2 * p - 1:  # p > ~129: the plateau is linear in p
        busy = v * m * (tf + tb + tw)
        idle = zbv_idle(p, tf, tb, tw)
        total, ideal = idle / (busy + idle), idle / busy
        source = ("schedule simulator at p = 3 and 4 (m = 2p-1), extrapolated linearly in p "
                  "(ZB-V idle is constant in m from 2p-1 on and linear in p)")
    elif sched == "zbv":  # p > 33,333 and m < 2p-1: not even one micro-batch simulated
        busy = v * m * (tf + tb + tw)
        idle = zbv_idle(p, tf, tb, tw)
        total, ideal = idle / (busy + idle), idle / busy
        source = "ZB-V's plateau at m = 2p-1, an estimate (too large to simulate)"
    else:  # zero-bubble, too large to simulate: the exact ZB-H1 idle (zb_h1_idle)
        busy = m * (tf + tb + tw)
        idle = zb_h1_idle(p, m, tf, tb, tw)
        total, ideal = idle / (busy + idle), idle / busy
        source = "ZB-H1 closed form (p-1)(t_f+t_b) - (min(m,p)-1)*min(t_f,t_b,t_w)"
    formula = {"total": "(p-1)/(v*m+p-1)", "ideal": "(p-1)/(v*m)"}[conv]
    if sched == "naive":
        formula = {"total": "(p-1)/p", "ideal": "p-1"}[conv]
    if sched in schedules.SPLIT_BACKWARD:
        formula = f"simulated {'ZB-V' if sched == 'zbv' else 'ZB-H1'} idle / " + \
            ("step time" if conv == "total" else "busy time")
    value = total if conv == "total" else ideal
    inputs = {"p": p, "m": m, "v": v, "schedule": sched}
    return {"schedule": sched, "p": p, "m": m, "v": v, "bubble_fraction": value,
            "bubble_fraction_total": total, "bubble_fraction_ideal": ideal,
            "closed_form": {"total": closed_t, "ideal": closed_i},
            "convention": label, "source": source, "simulation": sim,
            "explain": {"bubble_fraction": fig(value, "fraction", formula, inputs, label)}}


# --- memory --------------------------------------------------------------------------------------

def _activations(w: dict, pipe: dict) -> tuple[float, str, dict]:
    dims = ("layers", "hidden", "micro_batch_size") + (("seq_len", "heads")
                                                      if w["arch"] == "gpt" else ())
    missing = [d for d in dims if w[d] is None]
    if missing:
        return 0.0, "not modeled: give " + ", ".join(missing), {}
    p, v = w["pp"], w["virtual_stages"]
    act_bytes = w["act_bytes"] or (4 if w["memory_model"] == "fp32" else 2)
    b, h, L = w["micro_batch_size"], w["hidden"], w["layers"]
    if w["arch"] == "gpt":
        per_layer, f = gpt_activation_bytes_per_layer(
            w["seq_len"], b, h, w["heads"], w["tp"], w["sequence_parallel"],
            w["activation_checkpointing"], act_bytes)
    else:
        per_layer, f = simple_activation_bytes_per_layer(w["arch"], b, h, act_bytes)
    layers_per_chunk = L / (p * v)
    if pipe["simulation"] is not None:
        chunks = max(r["peak_inflight_microbatches"] for r in pipe["simulation"]["ranks"]) * v
    elif p == 1:
        chunks = 1
    else:
        chunks = {"gpipe": w["microbatches"], "naive": 1}.get(pipe["schedule"],
                                                             min(p, w["microbatches"])) * v
    value = per_layer * layers_per_chunk * chunks
    formula = f"per layer [{f}] x layers per chunk L/(p*v) x peak in-flight chunks (busiest rank)"
    inputs = {"s": w["seq_len"], "b": b, "h": h, "a": w["heads"], "L": L, "t": w["tp"], "p": p,
              "v": v, "peak_inflight_chunks": chunks, "act_bytes": act_bytes,
              "per_layer_bytes": per_layer}
    return value, formula, inputs


def _memory(w: dict, pipe: dict) -> dict:
    mm = MEMORY_MODELS[w["memory_model"]]
    psi, n, z = max(w["rank_params"]), w["dp"], w["zero_stage"]
    busiest = w["rank_params"].index(psi)
    comps = state_bytes(w, busiest, mm)
    psi_e = w["rank_expert_params"][busiest]
    act, act_formula, act_inputs = _activations(w, pipe)
    act_bytes = w["act_bytes"] or (4 if w["memory_model"] == "fp32" else 2)
    per_rank, formulas = rank_memory(w, mm, act_bytes) if "rank_params" in w else (None, {})
    extra = {}
    if per_rank:  # each component's busiest pipeline rank (the schedule's in-flight peak)
        act = max(r["activations"] for r in per_rank)
        extra = {k: max(r[k] for r in per_rank) for k in TRANSIENT}
        act_formula = formulas["activations"]
    comps["activations"] = act
    comps.update(extra)
    total = sum(comps.values())
    label = mm["label"]
    ins = {"Ψ_rank": psi, "N": n, "zero_stage": z, "p": mm["params"], "g": mm["grads"],
           "o": mm["optimizer"]}
    ep_note, div = "", {"params": 3, "grads": 2, "optimizer": 1}
    if psi_e:  # expert parallelism: ZeRO / N on the non-expert part only
        ins.update(Ψ_experts_rank=psi_e, ep=w["ep"])
        ep_note = "; expert parallelism: Ψ_dense = Ψ_rank - Ψ_experts_rank under ZeRO over N, " \
            "Ψ_experts_rank = routed experts / ep replicated over dp/ep (" + EP_STATE + ")"

    def _state(c: str, letter: str) -> str:
        if not psi_e:
            return f"{letter}*Ψ_rank" + ("/N" if z >= div[c] else "")
        return f"{letter}*Ψ_dense" + ("/N" if z >= div[c] else "") + f" + {letter}*Ψ_experts_rank"

    share = "Ψ_rank = params/(tp*pp)" if w["rank_params"].count(psi) == len(w["rank_params"]) \
        and w.get("strategy") is None else "Ψ_rank = parameters of the busiest (tp, pp) rank"
    explain = {
        "per_rank_bytes": fig(total, "bytes", "params + grads + optimizer + activations"
                              + "".join(f" + {k}" for k in extra),
                              {k: comps[k] for k in comps}, label),
        "model_state_bytes": fig(total - act, "bytes",
                                 ZERO_FORMULAS[z] + f"; {share}{ep_note}", ins, label),
        "components.params": fig(comps["params"], "bytes", _state("params", "p"), ins, label),
        "components.grads": fig(comps["grads"], "bytes", _state("grads", "g"), ins, label),
        "components.optimizer": fig(comps["optimizer"], "bytes", _state("optimizer", "o"), ins,
                                    label),
        "components.activations": fig(act, "bytes", act_formula, act_inputs,
                                      ACT_CONVENTION if w["arch"] == "gpt"
                                      else "saved layer inputs/outputs"),
    }
    for k in extra:
        explain[f"components.{k}"] = fig(extra[k], "bytes", formulas[k],
                                         {"busiest_pipeline_rank": True}, TRANSIENT[k])
    if extra.get("gathered_unit"):
        explain["components.gathered_unit"]["convention"] += "; " + GATHERED_CONVENTION
    by_stage = {str(k): v for k, v in zero_table(psi, n, w["memory_model"]).items()}
    return {"per_rank_bytes": total, "per_rank_GB": total / GB, "components": comps,
            "model_state_bytes": total - act - sum(extra.values()),
            "transient_bytes": sum(extra.values()), "per_rank": per_rank,
            "by_zero_stage": by_stage,
            "memory_model": w["memory_model"], "explain": explain}


# --- step time -----------------------------------------------------------------------------------

def _step(w: dict, pipe: dict, com: dict) -> dict:
    n = w["dp"] * w["tp"] * w["pp"]
    keys = ("compute_s", "per_rank_compute_s", "pipeline_compute_s", "time_no_overlap_s",
            "time_full_overlap_s", "speedup_no_overlap", "speedup_full_overlap",
            "efficiency_no_overlap", "efficiency_full_overlap")
    out = dict.fromkeys(keys)
    out["devices"] = n
    sim = pipe.get("simulation")
    if w["t_f"] is not None:  # configured stage times (timed): exact busy time per rank
        busy = w["microbatches"] * w["grad_accum"] * w["virtual_stages"] * \
            (w["t_f"] + (w["t_b_input"] or 0.0) + (w["t_b_weight"] or 0.0))
        out["per_rank_compute_s"] = busy
        if sim is not None:
            out["pipeline_compute_s"] = sim["makespan_s"] * w["grad_accum"]
        else:  # no pipeline, or too large to simulate: the bubble's share on top of busy
            out["pipeline_compute_s"] = busy / (1 - pipe["bubble_fraction_total"])
    conv = "lower bound: compute split evenly over dp*tp*pp devices, pipeline bubble over " \
           "total time, comm at full bandwidth"
    explain = {}
    if w["compute_ms"] is not None:
        c = w["compute_ms"] / 1000
        per = c / n
        pipe_t = per / (1 - pipe["bubble_fraction_total"]) if pipe["p"] > 1 else per
        out.update(compute_s=c, per_rank_compute_s=per, pipeline_compute_s=pipe_t)
        explain["pipeline_compute_s"] = fig(pipe_t, "s", "compute_ms/1000/(dp*tp*pp) / "
                                            "(1 - bubble_total)", {"compute_s": c, "devices": n,
                                            "bubble_total": pipe["bubble_fraction_total"]}, conv)
    t = com["time_lower_bound_s"]
    if out["pipeline_compute_s"] is not None and t is not None:
        pt = out["pipeline_compute_s"]
        out["time_no_overlap_s"] = pt + t
        out["time_full_overlap_s"] = max(pt, t)
        ins = {"pipeline_compute_s": pt, "comm_s": t, "compute_s": out["compute_s"],
               "devices": n}
        explain["time_no_overlap_s"] = fig(pt + t, "s", "compute + comm", ins, conv)
        explain["time_full_overlap_s"] = fig(max(pt, t), "s", "max(compute, comm)", ins, conv)
        if out["compute_s"] is not None:
            c = out["compute_s"]
            for mode, st in (("no_overlap", pt + t), ("full_overlap", max(pt, t))):
                sp = c / st if st > 0 else None
                out[f"speedup_{mode}"] = sp
                out[f"efficiency_{mode}"] = sp / n if sp is not None else None
                explain[f"speedup_{mode}"] = fig(sp, "x", f"compute_s / time_{mode}_s", ins,
                                                 conv)
                explain[f"efficiency_{mode}"] = fig(out[f"efficiency_{mode}"], "fraction",
                                                    f"speedup_{mode} / (dp*tp*pp)", ins, conv)
    missing = ["compute_ms"] if w["compute_ms"] is None else []
    missing += [] if t is not None else ["bandwidth_GBps"]
    if missing:
        explain["note"] = "step times need " + " and ".join(missing)
    out["explain"] = explain
    return out
