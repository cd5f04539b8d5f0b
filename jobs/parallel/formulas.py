"""The seeds' per-rank traffic and memory for each data-parallel strategy, per step, with the
nccl-tests factors of `jobs.commbytes` (the same factors the tracer uses), so a summary can put
the formula next to what the trace measured.

Traffic per step (Ψ = bytes of all parameters in the communication dtype, N = DP degree):
    dp-ps          root: receives (N-1)·Ψ gradients, sends (N-1)·Ψ parameters; worker: Ψ, Ψ
    dp-allreduce, ddp   all-reduce Ψ                      = 2(N-1)/N·Ψ
    zero1, zero2   reduce-scatter Ψ + all-gather Ψ           = 2(N-1)/N·Ψ
    zero3          all-gather Ψ twice + reduce-scatter Ψ     = 3(N-1)/N·Ψ = 1.5 × DDP
Model-state memory (elements × bytes; the seeds' 16Ψ model in bf16, 20Ψ with fp32 gradients;
fp32 training is 4 + 4 + 8):
    replicated: P + G + O;  zero1: P + G + O/N;  zero2: P + (G + O)/N;  zero3: (P + G + O)/N
"""

from __future__ import annotations

from jobs import commbytes

OPS = {"dp-ps": None, "dp-allreduce": [("all_reduce", 1)], "ddp": [("all_reduce", 1)],
       "zero1": [("reduce_scatter", 1), ("all_gather", 1)],
       "zero2": [("reduce_scatter", 1), ("all_gather", 1)],
       "zero3": [("all_gather", 2), ("reduce_scatter", 1)]}


def comm_per_step(strategy: str, n: int, psi_bytes: int, rank: int = 0,
                  rounds: int = 1) -> dict:
    """{"ops": [[op, payload, times], ...], "bytes_sent": .., "bytes_recv": ..} for one rank
    and one step of `rounds` accumulation rounds: ZeRO-2 reduce-scatters (and frees) the
    gradients of every round, ZeRO-3 also gathers the parameters twice per round; the others
    communicate once per step."""
    label = "zero3" if strategy == "fsdp" else strategy
    if label == "dp-ps":
        k = (n - 1) if rank == 0 else 1
        b = k * commbytes.bytes_sent("send", psi_bytes, n)
        return {"ops": [["recv" if rank == 0 else "send", psi_bytes, k],
                        ["send" if rank == 0 else "recv", psi_bytes, k]],
                "bytes_sent": b, "bytes_recv": b}
    ops = OPS[label]
    if label == "zero2":
        ops = [("reduce_scatter", rounds), ("all_gather", 1)]
    elif label == "zero3":
        ops = [("all_gather", 2 * rounds), ("reduce_scatter", rounds)]
    sent = sum(times * commbytes.bytes_sent(op, psi_bytes, n) for op, times in ops)
    return {"ops": [[op, psi_bytes, times] for op, times in ops], "bytes_sent": sent,
            "bytes_recv": sent}


def model_state(strategy: str, n: int, psi: int, precision: str = "fp32",
                fp32_grads: bool = False, rank: int = 0) -> dict:
    """Bytes of parameters / gradients / optimizer state one rank holds (exact, unpadded)."""
    label = "zero3" if strategy == "fsdp" else strategy
    if precision == "bf16":
        p, g, o = 2 * psi, 2 * psi, (16 if fp32_grads else 12) * psi
    else:
        p, g, o = 4 * psi, 4 * psi, 8 * psi
    if label == "dp-ps":
        return {"params": p, "grads": g, "optim": o if rank == 0 else 0}
    if label == "zero1":
        o //= n
    elif label == "zero2":
        g, o = g // n, o // n
    elif label == "zero3":
        p, g, o = p // n, g // n, o // n
    return {"params": p, "grads": g, "optim": o}


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
