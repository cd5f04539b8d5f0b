"""Per-rank memory peaks: what each pipeline rank holds beyond its model state (no torch).

    activations     peak over the rank's action list (jobs.schedules.schedule_actions) of the
                    bytes saved for backward by the (micro-batch, chunk) pairs in flight: + a
                    stage's bytes per micro-batch at F, - at BW (or W). Seed 003 "PP: check
                    stage balance": 1F1B keeps up to p - r micro-batches on rank r, GPipe m.
    recv_buffers    peak over the rank's action list of the live receive buffers, each one
                    stage boundary activation (b*s*h, s/t with SP; b*h for the mlp) in the
                    training dtype (act_bytes), by the rule jobs/parallel/pipeline/runtime.py
                    runs: per kind (F inputs, BW/B output gradients) one remote receive posted
                    ahead, the next at the previous one's wait; an activation is released at
                    its wait, a gradient after its BW (or its W after a B). `_recv_walk`.
    gathered_unit   ZeRO-3 / FSDP: the transient full copy (seed 003 "sharding: check the
                    temporary gather peak") as the spec's engine holds it, jobs/theory/
                    gathered.py: reference max(p*Ψ_root + (p+g)*Ψ_block, (p+g)*Ψ_root);
                    native (FSDP2) adds the prefetched block, the flat all-gather buffers and
                    the retained reduce-scatter input.
    comm_buffers    what the data-parallel implementation allocates for its collectives
                    (jobs/parallel/*.py): parameter server rank 0 receives N-1 full gradients;
                    ZeRO-1 one bucket shard at a time; ZeRO-2 the largest bucket's full
                    gradient plus its reduce-scatter output (one bucket in flight); DDP and
                    all-reduce DP reduce in place (0).

Activations per stage and micro-batch, as autograd saves them (parameters excluded, each
storage range once: jobs.memory.SavedTensorCounter), in units of b*h*act_bytes for the mlp:
    1 (the stage input, kept by its first Linear) + one ReLU output per block except the model's
    last + 2 on the last stage (the last Linear's output and the target, kept by the MSE loss).
GPT stages: model.gpt_saved_bytes, the same exact count for paralab's GPT (tp, sequence
parallelism); with activation checkpointing or a vocabulary-parallel head the Megatron per-layer
estimate (model.gpt_activation_bytes_per_layer, seed 004) instead.
"""

from __future__ import annotations

import math

from jobs import schedules

from .gathered import NATIVE_FORMULA, REFERENCE_FORMULA, fsdp2_peak, fsdp2_rounds, reference_peak
from .model import block_rank_params, gpt_activation_bytes_per_layer, gpt_saved_bytes
from .moe import ep_model_state, moe_dims, moe_saved_bytes

MAX_WALK_ACTIONS = 200_000


def stage_layers(L: int, chunks: int, stage: int) -> int:
    """Blocks on model stage `stage` (jobs/parallel/pipeline/stage.partition_even)."""
    q, r = divmod(L, chunks)
    return q + (stage < r)


def stage_activation_bytes(w: dict, stage: int, act_bytes: float) -> tuple[float, str]:
    """Bytes one micro-batch leaves saved for backward on model stage `stage`."""
    p, v, L = w["pp"], w["virtual_stages"], w["layers"]
    chunks = p * v
    n = stage_layers(L, chunks, stage)
    last = stage == chunks - 1
    b, h = w["micro_batch_size"], w["hidden"]
    if w["arch"] == "gpt" and w.get("vocab") and not w["activation_checkpointing"] \
            and not w.get("vocab_parallel"):
        cp = w.get("cp") or 1  # a CP rank: seq_len/cp tokens of its replica's sequences
        val, f = gpt_saved_bytes(w["seq_len"] // cp, w["cp_batch"] if cp > 1 else b, h,
                                 w["heads"], w["vocab"],
                                 blocks=n, first=stage == 0, last=last, tp=w["tp"],
                                 sequence_parallel=w["sequence_parallel"], act_bytes=act_bytes,
                                 moe_block=moe_block(w, act_bytes), cp=cp)
        if w.get("experts"):
            f += "; MoE block " + moe_saved_bytes(**moe_dims(w), act_bytes=act_bytes)[1]
        return val, f
    if w["arch"] == "gpt":  # what-if, checkpointing, vocab-parallel head: Megatron estimate
        per_layer, f = gpt_activation_bytes_per_layer(
            w["seq_len"], b, h, w["heads"], w["tp"], w["sequence_parallel"],
            w["activation_checkpointing"], act_bytes)
        return n * per_layer, f"layers in stage x [{f}]"
    if w["arch"] == "mlp":
        units = 1 + (n - (1 if last else 0)) + (2 if last else 0)
        return units * b * h * act_bytes, \
            "b*h*act_bytes*(1 input + ReLU outputs + 2 on the last stage: output, target)"
    return (1 + n) * b * h * act_bytes, "b*h*act_bytes*(1 + layers in stage) (timed)"


def moe_block(w: dict, act_bytes: float) -> float | None:
    """Saved bytes of one MoE block per micro-batch (None for a dense model)."""
    if not w.get("experts"):
        return None
    return moe_saved_bytes(**moe_dims(w), act_bytes=act_bytes)[0]


def _walk(actions, per_chunk: list[float]) -> tuple[float, int]:
    live: dict = {}
    cur = peak = 0.0
    peak_n = 0
    for a in actions:
        if a.kind == "F":
            live[(a.mb, a.chunk)] = per_chunk[a.chunk]
            cur += per_chunk[a.chunk]
        elif a.kind in ("BW", "W") and (a.mb, a.chunk) in live:
            cur -= live.pop((a.mb, a.chunk))
        peak = max(peak, cur)
        peak_n = max(peak_n, len(live))
    return peak, peak_n


def _recv_walk(actions, r: int, home: list[int]) -> int:
    """Peak count of live receive buffers on rank r (the runtime's rule, module docstring):
    F inputs and BW/B output gradients whose source stage is on another rank, one posted ahead
    per kind."""
    n_stages = len(home)
    queue: dict[str, list] = {"F": [], "G": []}
    for a in actions:
        if a.kind == "F" and a.stage != 0 and home[a.stage - 1] != r:
            queue["F"].append((a.mb, a.stage))
        elif a.kind in ("BW", "B") and a.stage != n_stages - 1 and home[a.stage + 1] != r:
            queue["G"].append((a.mb, a.stage))
    nxt = {"F": 0, "G": 0}
    live: set = set()
    peak = 0

    def post(kind):
        nonlocal peak
        if nxt[kind] < len(queue[kind]):
            live.add((kind, *queue[kind][nxt[kind]]))
            nxt[kind] += 1
            peak = max(peak, len(live))

    post("F")
    post("G")
    for a in actions:
        key = ("F" if a.kind == "F" else "G", a.mb, a.stage)
        if a.kind == "W":
            live.discard(key)
        elif key in live:  # this action's receive: waited, then the next of its kind posted
            if a.kind == "F":
                live.discard(key)  # the stage input from here on (an activation)
            post(key[0])
            if a.kind == "BW":
                live.discard(key)
    return peak


def pipeline_ranks(w: dict, act_bytes: float) -> list[dict] | None:
    """Per pipeline rank: activations, recv_buffers and the in-flight count, or None when the
    model dimensions are missing."""
    dims = ("layers", "hidden", "micro_batch_size") + (("seq_len", "heads")
                                                      if w["arch"] == "gpt" else ())
    if any(w[d] is None for d in dims):
        return None
    p, v, m, sched = w["pp"], w["virtual_stages"], w["microbatches"], w["pp_schedule"]
    chunks = p * v
    place = schedules.placement_of(sched) if p > 1 else "loop"
    per_stage = [stage_activation_bytes(w, s, act_bytes) for s in range(chunks)]
    if w["arch"] == "gpt":
        s_len = w["seq_len"] // (w["tp"] if w["sequence_parallel"] else 1)
        boundary = w["micro_batch_size"] * s_len * w["hidden"] * act_bytes
    else:
        boundary = w["micro_batch_size"] * w["hidden"] * act_bytes
    walk = p == 1 or p * m * v * 3 <= MAX_WALK_ACTIONS
    acts = schedules.cached_actions(sched, p, m, v) if walk and p > 1 else None
    home = [schedules.rank_of(s, p, v, place) for s in range(chunks)]
    out = []
    for r in range(p):
        stages = [schedules.stage_of(r, c, p, v, place) for c in range(v)]
        per_chunk = [per_stage[s][0] for s in stages]
        if p == 1:
            peak, n_in = per_chunk[0], 1  # one micro-batch at a time (forward, then backward)
            recv = 0
        elif acts is not None:
            peak, n_in = _walk(acts[r], per_chunk)
            recv = _recv_walk(acts[r], r, home) * boundary
        else:  # too large to walk: the closed-form in-flight count on the largest chunk
            n_in = {"gpipe": m, "naive": 1}.get(sched, min(p - r, m)) * v
            peak = n_in * max(per_chunk)
            # receive buffers: a bound, one activation + two gradients (the one in its BW and
            # the next posted), + the gradients a B keeps for its W (at most those in flight)
            recv = (3 + (n_in if sched in schedules.SPLIT_BACKWARD else 0)) * boundary
        out.append({"rank": r, "stages": stages, "activations": peak,
                    "activations_per_microbatch": per_chunk, "peak_inflight_chunks": n_in,
                    "recv_buffers": float(recv),
                    "formula": per_stage[stages[0]][1]})
    return out


def head_params(w: dict, r: int) -> float | None:
    """Root parameters used after the blocks on pipeline rank r (GPT: final LayerNorm + LM
    head, on the rank of the last model stage; the vocabulary split over tp when vocab-
    parallel), None where unknown (then the whole root: an upper bound)."""
    if w["arch"] != "gpt":
        return 0.0 if w["arch"] == "mlp" else None
    if not w.get("vocab") or w["hidden"] is None:
        return None
    chunks = w["pp"] * w["virtual_stages"]
    place = schedules.placement_of(w["pp_schedule"]) if w["pp"] > 1 else "loop"
    if all(schedules.stage_of(r, c, w["pp"], w["virtual_stages"], place) != chunks - 1
           for c in range(w["virtual_stages"])):
        return 0.0
    h = w["hidden"]
    return 2 * h + h * w["vocab"] / (w["tp"] if w.get("vocab_parallel") else 1)


def gathered_unit(w: dict, unit_params: list[int] | None, bytes_params: float,
                  bytes_grads: float, head: float | None = None) -> tuple[float, str]:
    """ZeRO-3 / FSDP transient full copy on one rank (0 below stage 3 or without dp), as the
    spec's engine holds it (jobs/theory/gathered.py: the reference engine's Zero3, or FSDP2's
    fully_shard with its prefetch and flat buffers on the native engine)."""
    if w["zero_stage"] != 3 or w["dp"] < 2 or not unit_params:
        return 0.0, "0 (parameters not sharded)"
    root, blocks = unit_params[-1], unit_params[:-1]
    if w.get("engine") == "native":
        return fsdp2_peak(root, blocks, bytes_params, bytes_grads, head, fsdp2_rounds(w)), \
            NATIVE_FORMULA
    return reference_peak(root, blocks, bytes_params, bytes_grads), REFERENCE_FORMULA


def comm_buffers(w: dict, psi: float, bucket_params: float, bytes_grads: float,
                 dp_coord: int) -> tuple[float, str]:
    n, z, mode = w["dp"], w["zero_stage"], w["dp_mode"]
    if n < 2:
        return 0.0, "0 (no data parallelism)"
    if z == 0 and mode == "ps":
        if dp_coord:
            return 0.0, "0 (worker: sends / receives its own buffers)"
        return (n - 1) * psi * bytes_grads, "(N-1)*Ψ*g: one receive buffer per worker"
    bucket = min(psi, bucket_params)
    pad = (-bucket) % n
    if z == 1:
        return (bucket + pad) / n * bytes_grads, "Ψ_bucket/N*g: one shard at a time"
    if z == 2:
        return (bucket + pad) * (1 + 1 / n) * bytes_grads, \
            "Ψ_bucket*(1 + 1/N)*g: the largest bucket and its reduce-scatter output"
    return 0.0, "0 (reduced in place / per unit)"


def state_bytes(w: dict, r: int, mm: dict) -> dict:
    """Model state of pipeline rank r: its Ψ under ZeRO over dp, or with expert parallelism
    the non-expert Ψ under ZeRO, its EP shard of the experts unsharded (moe.ep_model_state)."""
    from .memory import model_state_bytes
    psi, n, z = w["rank_params"][r], w["dp"], w["zero_stage"]
    b = {"bytes_params": mm["params"], "bytes_grads": mm["grads"],
         "bytes_optimizer": mm["optimizer"]}
    local = (w.get("rank_expert_params") or [0] * (r + 1))[r]
    if not local:
        return model_state_bytes(psi, n, z, **b)
    ep = w["ep"]
    return ep_model_state(psi - local + local * ep, local * ep, n, ep, z, **b)


def rank_memory(w: dict, mm: dict, act_bytes: float) -> tuple[list[dict], dict]:
    """Per pipeline rank (index = pp coordinate; the dp coordinate 0 / the busiest dp rank):
    model state, activations, recv_buffers, gathered_unit, comm_buffers; and the formulas
    (the same text for every rank)."""
    pr = pipeline_ranks(w, act_bytes)
    n = w["dp"]
    impl = "bucket_mb" in w  # derived from a JobSpec (jobs/theory/whatif.inputs_from_spec)
    bucket_params = w.get("bucket_mb", 25.0) * (1 << 20) / mm["params"]
    out, formulas = [], {}
    for r, psi in enumerate(w["rank_params"]):
        row = {"rank": r, **state_bytes(w, r, mm)}
        dense = psi - (w.get("rank_expert_params") or [0] * (r + 1))[r]
        info = pr[r] if pr else {}
        row["activations"] = info.get("activations", 0.0)
        units = [padded(u, n) for u in _units(w, psi, r) or []]
        row["gathered_unit"], fg = gathered_unit(w, units, mm["params"], mm["grads"],
                                                 head_params(w, r))
        # buffers of paralab's implementation: for a job spec only (a what-if names none)
        row["recv_buffers"] = info.get("recv_buffers", 0.0) if impl else 0.0
        row["comm_buffers"], fc = comm_buffers(w, dense, bucket_params, mm["params"], 0) \
            if impl else (0.0, "not modeled for a what-if (implementation buffers)")
        row["total"] = sum(row[k] for k in ("params", "grads", "optimizer", "activations",
                                            "recv_buffers", "gathered_unit", "comm_buffers"))
        row["peak_inflight_chunks"] = info.get("peak_inflight_chunks")
        out.append(row)
        formulas = {"activations": "peak over the rank's schedule of the in-flight "
                                   "(micro-batch, chunk) bytes; per micro-batch "
                                   + (info.get("formula") or "not modeled"),
                    "recv_buffers": "peak live receive buffers x b*s*h*act_bytes (one "
                                    "receive per kind posted ahead; activations released at "
                                    "their wait, gradients after BW or W)",
                    "gathered_unit": fg, "comm_buffers": fc}
    return out, formulas


def _units(w: dict, psi: float, r: int) -> list[int] | None:
    """ZeRO-3 units on pipeline rank r: one per block, then the root (the rest)."""
    if w["layers"] is None or w["hidden"] is None:
        return None
    h, tp = w["hidden"], w["tp"]
    chunks = w["pp"] * w["virtual_stages"]
    place = schedules.placement_of(w["pp_schedule"]) if w["pp"] > 1 else "loop"
    nblocks = sum(stage_layers(w["layers"], chunks,
                               schedules.stage_of(r, c, w["pp"], w["virtual_stages"], place))
                  for c in range(w["virtual_stages"]))
    block = block_rank_params(h, tp, w.get("experts") or 0, w.get("shared_expert", False)) \
        if w["arch"] == "gpt" else h * h + h
    return [math.ceil(block)] * nblocks + [max(0, math.ceil(psi - nblocks * block))]


def padded(x: float, n: int) -> float:
    return x + (-x) % n
