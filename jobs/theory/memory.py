"""Model-state memory per rank under the seeds' accounting conventions (no torch).

Bytes per parameter by component (the convention is always an explicit input):

    16psi  params 2 (fp16/bf16) + grads 2 + optimizer 12 (fp32 master 4, Adam m 4, v 4)
           seed 000 main text ("16M"), seed 001 ("2+2+K, K=12"), seed 003 ("16B/参数").
    20psi  params 2 + grads 2 + optimizer 16 (adds the fp32 gradient copy 4)
           seed 000 Q3/Q8 (the ZeRO paper's accounting).
    fp32   params 4 + grads 4 + optimizer 8 (Adam m, v in fp32; the weights are the master copy).

ZeRO over the data-parallel degree N: stage >= 1 divides the optimizer state by N, >= 2 the
gradients, 3 the parameters (seed 000's table: 16M | 4M+12M/N | 2M+14M/N | 16M/N).
"""

from __future__ import annotations

MEMORY_MODELS: dict[str, dict] = {
    "16psi": {"params": 2, "grads": 2, "optimizer": 12,
              "label": "16Ψ: fp16/bf16 params 2 + grads 2 + fp32 master/m/v 12 bytes per "
                       "parameter (seeds 000, 001, 003)"},
    "20psi": {"params": 2, "grads": 2, "optimizer": 16,
              "label": "20Ψ: fp16/bf16 params 2 + grads 2 + fp32 master/grad copy/m/v 16 bytes "
                       "per parameter (seed 000 Q3/Q8, ZeRO paper)"},
    "fp32": {"params": 4, "grads": 4, "optimizer": 8,
             "label": "fp32: params 4 + grads 4 + Adam m/v 8 bytes per parameter"},
}

ZERO_FORMULAS = {
    0: "(p + g + o)*Ψ",
    1: "(p + g)*Ψ + o*Ψ/N",
    2: "p*Ψ + (g + o)*Ψ/N",
    3: "(p + g + o)*Ψ/N",
}


def model_state_bytes(psi: float, n: int, stage: int, *, bytes_params: float = 2,
                      bytes_grads: float = 2, bytes_optimizer: float = 12) -> dict:
    """Per-rank bytes of params / grads / optimizer for Ψ parameters on this rank, ZeRO `stage`
    over `n` data-parallel ranks."""
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"zero stage must be 0..3, got {stage!r}")
    if n < 1:
        raise ValueError(f"data-parallel degree must be >= 1, got {n!r}")
    return {
        "params": bytes_params * psi / (n if stage >= 3 else 1),
        "grads": bytes_grads * psi / (n if stage >= 2 else 1),
        "optimizer": bytes_optimizer * psi / (n if stage >= 1 else 1),
    }


def rank_state_bytes(psi: float, n: int, stage: int, memory_model: str, *,
                     dp_mode: str = "collective", dp_coord: int = 0) -> dict:
    """model_state_bytes of one rank under a memory model (MEMORY_MODELS key): the rank at
    data-parallel coordinate `dp_coord`, so a parameter-server worker (jobs.strategies.ps_worker:
    the server updates for everyone) holds no optimizer state (seed 001)."""
    from jobs.strategies import ps_worker
    mm = MEMORY_MODELS[memory_model]
    out = model_state_bytes(psi, n, stage, bytes_params=mm["params"], bytes_grads=mm["grads"],
                            bytes_optimizer=mm["optimizer"])
    if ps_worker(dp_mode, stage, dp_coord):
        out["optimizer"] = 0
    return out


def zero_table(psi: float, n: int, memory_model: str) -> dict:
    """{stage: per-rank model-state bytes} for stages 0..3 under `memory_model`."""
    mm = MEMORY_MODELS[memory_model]
    out = {}
    for stage in range(4):
        c = model_state_bytes(psi, n, stage, bytes_params=mm["params"], bytes_grads=mm["grads"],
                              bytes_optimizer=mm["optimizer"])
        out[stage] = sum(c.values())
    return out


def memory_model_of_spec(spec) -> str:
    """fp32 -> 'fp32'; bf16 -> '16psi', or '20psi' with train.fp32_grads."""
    from jobs.strategies import memory_model
    return memory_model(spec.train.precision, spec.train.fp32_grads)
