"""The theory model: memory, communication, step time and pipeline bubbles (pure Python).

Standard library only (no torch, no numpy), so the backend imports it cheaply. Every convention
is an explicit input and is repeated next to every number (docs/conventions.md lists them, with
each seed worked example and the few that do not agree with their own formula).

Public API
----------
predict(obj, **overrides) -> dict
    obj: a JobSpec, a job-spec dict / `{"preset": ...}` (parsed with jobs.spec.parse_spec), or a
    what-if dict with at least `params`, `dp`, `tp`, `pp`, `zero_stage`,
    `memory_model` ("16psi" | "20psi" | "fp32") and optionally grad_bytes, bandwidth_GBps,
    compute_ms (the whole global batch on one device), microbatches, virtual_stages,
    pp_schedule, dp_mode, allreduce_algorithm, bubble_convention ("total" | "ideal"),
    comm_convention ("ring-exact" | "asymptotic" | "seed000-table"), and for activation / TP / PP
    traffic arch, layers, hidden, heads, seq_len, micro_batch_size, grad_accum,
    sequence_parallel, activation_checkpointing, act_bytes, and per-stage pipeline times t_f,
    t_b_input, t_b_weight (seconds per model stage and micro-batch); for two links nnodes,
    nproc_per_node, intra_bandwidth_GBps, inter_bandwidth_GBps (links.py). See whatif.FIELDS.
    overrides (JobSpec / spec dict only): the same optional what-if fields.
    Invalid input raises jobs.spec.SpecError (a ValueError) whose `.errors` are
    [{"loc": ["dp"], "msg": "must be >= 1", "type": "greater_than_equal"}, ...].

    Output shape (JSON-ready; bytes are plain numbers, decimal GB = 1e9 bytes): sections hold
    their numbers directly, and each section's `explain` maps a key path of that section to a
    figure {"value", "unit", "formula", "inputs", "convention"}:
      kind                "whatif" | "spec"
      inputs              the validated inputs (for a spec, derived from it)
      conventions         {"memory_model", "bubble", "comm", "units"}: the active labels
      params              {"total", "per_rank", "per_pipeline_rank"} (with expert parallelism
                           what a rank holds: Ψ_dense + Ψ_experts / ep)
      memory              {"per_rank_bytes", "per_rank_GB", "components": {"params", "grads",
                           "optimizer", "activations", and for a spec-derived input the
                           transient "recv_buffers", "gathered_unit", "comm_buffers"},
                           "model_state_bytes", "transient_bytes", "per_rank": [per pipeline
                           rank {"rank", "params", "grads", "optimizer", "activations",
                           "recv_buffers", "gathered_unit", "comm_buffers", "total",
                           "peak_inflight_chunks"}] (ranks.py), "by_zero_stage":
                           {"0".."3": model-state bytes}, "memory_model", "explain"}
      comm                {"bytes_per_rank", "GB_per_rank", "time_lower_bound_s" (None without
                           bandwidth), "components": {"dp", "tp", "pp"} per step (and
                           "ep", "edp" when parallel.ep > 1: moe.py, docs/conventions.md
                           "Mixture of experts"), "ep": the all-to-all figures (None
                           without EP: "value", "dispatch_combine", "counts",
                           "group_payload", "group_counts_payload", "formula", "inputs"),
                           "links": each axis's link (intra / inter host), bytes and time on
                           it, and per-link sums (links.py, docs/conventions.md "Two links"),
                           "per_microbatch": {"tp", "pp"}, "convention", "dp_ops",
                           "tp_ops_per_microbatch", "pp_ops_per_microbatch", "dp_by_zero_stage",
                           "allreduce_algorithms", "explain"}
      step                {"devices", "compute_s", "per_rank_compute_s", "pipeline_compute_s",
                           "time_no_overlap_s", "time_full_overlap_s", "speedup_no_overlap",
                           "speedup_full_overlap", "efficiency_no_overlap",
                           "efficiency_full_overlap", "explain"} (None where inputs are missing)
      pipeline            {"schedule", "p", "m", "v", "bubble_fraction" (in the chosen
                           convention), "bubble_fraction_total", "bubble_fraction_ideal",
                           "closed_form", "convention", "source", "simulation", "explain"}
    A collective_bench spec has no model: kind "collective_bench", memory.per_rank_bytes = the
    largest message's two buffers (components.buffers), comm / step / pipeline None.
    `components` holds each component's busiest pipeline rank and per_rank_bytes their sum (an
    upper bound, what a memory gate needs); `per_rank` has every pipeline rank's own figures.

param_count(model) -> int                  model.py: mlp / gpt / timed, assumptions there
stage_params(model, pp, v, tp) -> list[int] parameters per pipeline rank (one TP shard)
allreduce_algorithms(n, M) -> list[dict]   seed 000's table: total volume, steps, bottleneck
model_state_bytes(psi, n, stage, bytes_params=2, bytes_grads=2, bytes_optimizer=12) -> dict
zero_table(psi, n, memory_model) -> {stage: bytes}
dp_bytes_per_rank(psi, n, zero_stage, grad_bytes, dp_mode="ddp", convention="ring-exact")
dp_collectives(payload_bytes, n, zero_stage, dp_mode="ddp") -> [(op, bytes, n, count)]
gpt_activation_bytes_per_layer(s, b, h, a, tp=1, sequence_parallel=False, checkpointing=False,
                               act_bytes=2) -> (bytes, formula)
stage_times(spec) -> {"t_f", "t_b_input", "t_b_weight"} | None   per-stage seconds of a timed
    spec, to pass to jobs.schedules.simulate(spec.parallel.pp_schedule, pp, m, v, **times)
moe.py: a2a_bytes, expert_capacity, uniform_kept, ep_model_state, expert_params,
    moe_saved_bytes (MoE block activations), ep_bytes_per_rank, routing_correction
MEMORY_MODELS, COMM_CONVENTIONS, GB
The pipeline schedules and their simulator live in jobs/schedules.py.
"""

from .comm import (
    ALGORITHMS,
    COMM_CONVENTIONS,
    allreduce_algorithms,
    dp_bytes_per_rank,
    dp_collectives,
    pp_bytes_per_microbatch,
    tp_bytes_per_microbatch,
)
from .memory import MEMORY_MODELS, memory_model_of_spec, model_state_bytes, zero_table
from .model import gpt_activation_bytes_per_layer, param_count, stage_params
from .predict import GB, predict
from .whatif import FIELDS, parse_whatif, stage_times

__all__ = [
    "ALGORITHMS", "COMM_CONVENTIONS", "FIELDS", "GB", "MEMORY_MODELS", "allreduce_algorithms",
    "dp_bytes_per_rank", "dp_collectives", "gpt_activation_bytes_per_layer",
    "memory_model_of_spec", "model_state_bytes", "param_count", "parse_whatif",
    "pp_bytes_per_microbatch", "predict", "stage_params", "stage_times",
    "tp_bytes_per_microbatch",
    "zero_table",
]
