"""The theory model's numbers for a run, per rank (jobs.theory, no torch): model-state memory
by component, activations, bytes per mesh axis per step, pipeline bubble.

`predict(spec)` gives the busiest rank's figures; per rank, model state is recomputed with the
same formula (jobs.theory.model_state_bytes) on that rank's pipeline-stage parameter count
(`params.per_pipeline_rank[pp]`). Activations and per-axis bytes stay the busiest rank's.
"""

from __future__ import annotations

from jobs.spec import JobSpec, parse_spec
from jobs.strategies import ps_worker

COMPONENTS = {"params": "params", "grads": "grads", "optimizer": "optimizer"}


def spec_of(spec: JobSpec | dict | None, warnings: list[str]) -> JobSpec | None:
    if spec is None or isinstance(spec, JobSpec):
        return spec
    try:
        return parse_spec(spec, max_world_size=1 << 30)
    except (ValueError, TypeError) as exc:
        warnings.append(f"spec in the trace does not parse ({exc}); no predictions")
        return None


def theory(spec: JobSpec | None, warnings: list[str]) -> dict | None:
    if spec is None or spec.kind != "train":
        return None
    try:
        from jobs.theory import predict
        return predict(spec)
    except Exception as exc:  # noqa: BLE001 - a theory gap must not lose the analysis
        warnings.append(f"theory prediction failed ({type(exc).__name__}: {exc})")
        return None


def rank_model_state(pred: dict | None, spec: JobSpec | None, pp_coord: int,
                     dp_coord: int = 0) -> dict:
    """{"params", "grads", "optimizer"} predicted bytes for a rank at pipeline coordinate pp (a
    parameter-server worker, dp > 0 of dp-ps, holds no optimizer state: seed 001)."""
    if not pred or spec is None:
        return {}
    from jobs.theory.memory import rank_state_bytes
    rows = (pred.get("memory") or {}).get("per_rank")
    if spec.parallel.ep > 1 and rows:  # experts not ZeRO-sharded: the theory's own rows
        row = rows[min(max(pp_coord, 0), len(rows) - 1)]
        return {k: row[v] for k, v in COMPONENTS.items()}
    per = pred["params"].get("per_pipeline_rank") or [pred["params"]["per_rank"]]
    psi = per[min(max(pp_coord, 0), len(per) - 1)]
    c = rank_state_bytes(psi, spec.parallel.dp, spec.parallel.zero_stage,
                         pred["memory"]["memory_model"], dp_mode=spec.parallel.dp_mode,
                         dp_coord=dp_coord)
    return {k: float(c[v]) for k, v in COMPONENTS.items()}


def rank_extra(pred: dict | None, spec: JobSpec | None, pp_coord: int,
               dp_coord: int = 0) -> dict:
    """Predicted activations and transient buffers of a rank (jobs/theory/ranks.py): its
    pipeline rank's row; a parameter-server worker (dp > 0) allocates no receive buffers."""
    rows = ((pred or {}).get("memory") or {}).get("per_rank")
    if not rows or spec is None:
        a = activations(pred)
        return {"activations": a} if a else {}
    row = rows[min(max(pp_coord, 0), len(rows) - 1)]
    out = {k: row[k] for k in ("activations", "recv_buffers", "gathered_unit", "comm_buffers")}
    if ps_worker(spec.parallel.dp_mode, spec.parallel.zero_stage, dp_coord):
        out["comm_buffers"] = 0.0
    return out


def routing_activations(pred: dict | None, spec: JobSpec | None, records: list[dict],
                        pp_coord: int = 0) -> float:
    """Mixture of experts: what this rank's observed routing adds to the uniform-routing
    activations at its peak (jobs.theory.moe.routing_correction over the micro-batches its
    pipeline rank holds at once); 0 for a dense model."""
    if not pred or spec is None or not spec.model.experts:
        return 0.0
    from jobs.theory.moe import inflight_correction, moe_dims, routing_correction
    w = pred["inputs"]
    corr = routing_correction(records, **moe_dims(w), act_bytes=w["act_bytes"])
    rows = (pred.get("memory") or {}).get("per_rank") or [{}]
    row = rows[min(max(pp_coord, 0), len(rows) - 1)]
    return inflight_correction(corr, row.get("peak_inflight_chunks") or 1)


def activations(pred: dict | None) -> float | None:
    if not pred:
        return None
    a = pred["memory"]["components"].get("activations")
    return a or None


def axis_bytes_per_step(pred: dict | None) -> dict:
    """axis -> predicted bytes sent per step by the busiest rank."""
    if not pred or not pred.get("comm"):
        return {}
    return dict(pred["comm"].get("components") or {})


def pipeline(pred: dict | None) -> dict | None:
    return (pred or {}).get("pipeline")
