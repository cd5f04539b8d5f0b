"""The data-parallel strategies, one row each: the label a run is filed under, the family the
composition builds it from, its ZeRO stage and whether it has a parameter-server role; and
the rules read off that table (which row a spec's parallel section is, a parameter-server
worker's state, the model-state memory model of a precision).

Standard library only: jobs.spec, jobs.compose, jobs.parallel.formulas, jobs.summary and the
theory all read it, so the two naming schemes (labels such as `dp-ps` / `fsdp`, families such
as `ps` / `zero3`) are tied together here once.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DPStrategy:
    label: str  # spec.strategy's DP part and the preset's name
    family: str  # jobs.compose's DP table key: the dp_mode, or zero{stage}
    zero_stage: int
    dp_mode: str | None  # spec.parallel.dp_mode it needs; None = any (ZeRO shards either way)
    engine: str | None  # spec.parallel.engine it needs; None = any
    parameter_server: bool  # rank 0 serves, the other DP ranks are workers (seed 001)


# Order matters where rows overlap: fsdp (ZeRO-3 on the native engine) before zero3.
DP_STRATEGIES: dict[str, DPStrategy] = {s.label: s for s in [
    DPStrategy("single", "single", 0, None, None, False),
    DPStrategy("dp-ps", "ps", 0, "ps", None, True),
    DPStrategy("dp-allreduce", "allreduce", 0, "allreduce", None, False),
    DPStrategy("ddp", "ddp", 0, "ddp", None, False),
    DPStrategy("zero1", "zero1", 1, None, None, False),
    DPStrategy("zero2", "zero2", 2, None, None, False),
    DPStrategy("fsdp", "zero3", 3, None, "native", False),
    DPStrategy("zero3", "zero3", 3, None, None, False),
]}

# label -> ZeRO stage of the strategies that synchronise over dp > 1 (not "single")
ZERO_STAGE = {s.label: s.zero_stage for s in DP_STRATEGIES.values() if s.label != "single"}


def dp_strategy(dp_mode: str, zero_stage: int, engine: str, dp: int = 2) -> DPStrategy:
    """The row a parallel section's DP settings select; "single" when dp = 1."""
    if dp == 1:
        return DP_STRATEGIES["single"]
    for s in DP_STRATEGIES.values():
        if s.label != "single" and s.zero_stage == zero_stage \
                and s.dp_mode in (None, dp_mode) and s.engine in (None, engine):
            return s
    raise ValueError(f"no data-parallel strategy has dp_mode {dp_mode!r} with ZeRO stage "
                     f"{zero_stage} on engine {engine!r}")


def of_parallel(p, dp: int | None = None) -> DPStrategy:
    """dp_strategy of a spec's ParallelSpec (dp: the degree to use, default p.dp)."""
    return dp_strategy(p.dp_mode, p.zero_stage, p.engine, p.dp if dp is None else dp)


def ps_worker(dp_mode: str, zero_stage: int, dp_coord: int) -> bool:
    """A parameter-server worker (a DP rank other than the server, rank 0 of dp): it holds no
    optimizer state and allocates no receive buffers, the server updates for everyone."""
    return dp_coord != 0 and any(s.parameter_server and s.dp_mode == dp_mode
                                 and s.zero_stage == zero_stage for s in DP_STRATEGIES.values())


def memory_model(precision: str, fp32_grads: bool = False) -> str:
    """The model-state memory model (jobs.theory.memory.MEMORY_MODELS key) of a precision:
    fp32 -> 'fp32'; bf16 -> '16psi', or '20psi' with an fp32 gradient copy."""
    if precision == "fp32":
        return "fp32"
    return "20psi" if fp32_grads else "16psi"
