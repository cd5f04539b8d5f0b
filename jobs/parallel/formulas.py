"""The seeds' per-rank traffic and model-state memory of each data-parallel strategy, per step,
for the run summary's `formula_check`: both come from `jobs.theory` (the one formula table:
`theory.comm.dp_collectives` / `dp_bytes_per_rank`, `theory.memory.rank_state_bytes`, which
knows a parameter-server worker holds no optimizer state), with the nccl-tests factors of
`jobs.commbytes` the tracer uses.

What is added here is only what a run has and the theory's per-step figure has not: gradient
accumulation (ZeRO-2 reduce-scatters every round, ZeRO-3 also gathers the parameters twice per
round; the others communicate once per step).
"""

from __future__ import annotations

from jobs import commbytes
from jobs.strategies import DP_STRATEGIES, ZERO_STAGE, memory_model
from jobs.theory.comm import dp_bytes_per_rank, dp_collectives
from jobs.theory.memory import rank_state_bytes


def comm_per_step(strategy: str, n: int, psi_bytes: int, rank: int = 0,
                  rounds: int = 1) -> dict:
    """{"ops": [[op, payload, times], ...], "bytes_sent": .., "bytes_recv": ..} for one rank
    and one step of `rounds` accumulation rounds."""
    stage = ZERO_STAGE[strategy]
    if DP_STRATEGIES[strategy].parameter_server:
        k = (n - 1) if rank == 0 else 1
        role = dp_bytes_per_rank(psi_bytes, n, 0, 1, "ps")["per_role"]
        b = role["server" if rank == 0 else "worker"]
        return {"ops": [["recv" if rank == 0 else "send", psi_bytes, k],
                        ["send" if rank == 0 else "recv", psi_bytes, k]],
                "bytes_sent": b, "bytes_recv": b}
    ops = [(op, count * (rounds if stage >= 2 and (op == "reduce_scatter" or stage == 3)
                         else 1))
           for op, _, _, count in dp_collectives(psi_bytes, n, stage)]
    sent = sum(times * commbytes.bytes_sent(op, psi_bytes, n) for op, times in ops)
    return {"ops": [[op, psi_bytes, times] for op, times in ops], "bytes_sent": sent,
            "bytes_recv": sent}


def model_state(strategy: str, n: int, psi: int, precision: str = "fp32",
                fp32_grads: bool = False, rank: int = 0) -> dict:
    """Bytes of `params` / `grads` / `optimizer` one rank holds (exact, unpadded)."""
    s = DP_STRATEGIES[strategy]
    out = rank_state_bytes(psi, n, s.zero_stage, memory_model(precision, fp32_grads),
                           dp_mode=s.dp_mode, dp_coord=rank)
    return {k: int(v) if float(v).is_integer() else v for k, v in out.items()}


NATIVE_DEVIATIONS = {
    "ddp": "DistributedDataParallel: bucketed all-reduce as formula; after step 0 the reducer "
           "rebuilds its buckets and broadcasts the new order from rank 0 (two small "
           "broadcasts, step 1 only).",
    "zero1": "ZeroRedundancyOptimizer: DDP all-reduces the full gradients (2(N-1)/N·Ψ, not a "
             "reduce-scatter), then every rank broadcasts the whole parameters it owns: a rank "
             "sends its own partition (uneven: whole parameters), receives the others.",
    "zero2": "FSDP2 reshard_after_forward=False: one all-gather per step (forward), kept for "
             "backward; gradients reduce-scattered. Dim-0 sharding pads uneven parameters.",
    "zero3": "FSDP2 reshard_after_forward=True: all-gather before forward and again before "
             "backward, reduce-scatter of gradients; the root module is not resharded after "
             "forward (no second all-gather for its parameters).",
}
