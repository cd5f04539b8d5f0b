"""ZeRO-3 / FSDP: the bytes a rank holds gathered (unsharded) at its peak, per engine.

Units: `root` (the parameters outside the repeated blocks: embeddings, head, final norm) and
`blocks` (one unit per block, forward order); p, g: bytes per parameter of the unsharded
parameters and gradients (the compute dtype). Both figures are the maximum over the moments
of one step of the sum of what is alive then, each moment read off the engine's code.

reference  (jobs/parallel/zero.py Zero3): the root unit wraps the whole model, so it is
    gathered for the whole forward, gathered again when backward starts (a hook on the
    output) and freed by its own reduce-scatter, the last of the step. Block i: gathered for
    its forward, again for its backward; its full gradient exists next to its full
    parameters until the reduce-scatter. No prefetch.
        max( p*R + (p + g)*B_max ,   (p + g)*R )
        (a block's backward)         (the root's reduce-scatter, at the end)

native     FSDP2, torch.distributed.fsdp.fully_shard(reshard_after_forward=True) per block and
    on the root (jobs/parallel/native.py), torch 2.13 defaults, in the order the ops run on one
    CPU thread (gloo). What FSDP2 keeps (torch/distributed/fsdp/_fully_shard/):
      - the root's parameters p*R from its all-gather (forward, again at backward's start) to
        its post-backward; the gradients of its part used after the blocks (H: final norm +
        head) from the head's backward, the rest (the embeddings) after the blocks, all until
        its reduce-scatter, the last (its input needs no gradient: post-backward runs in the
        final callback);
      - an all-gather writes a flat buffer (p*U) that is copied out into per-parameter
        tensors (p*U): 2p*U during the copy-out; in forward the previous unit's flat buffer is
        kept until the next unit's flat buffer exists (copy-in), then dropped;
      - backward prefetch (default, _backward_prefetch): at block i's pre-backward the
        all-gather of block i-1 is issued, its flat buffer p*B_{i-1} held until i-1's turn;
      - post-backward: the unsharded gradients (g*B_i) are copied into a flat reduce-scatter
        input (g*B_i) which FSDP2 retains until the next post-backward
        (reduce_scatter_max_input_buffers = 1);
      - gradient accumulation (`rounds` micro-batches, gradient sync off on all but the last:
        set_requires_gradient_sync(False), NativeFSDP.no_sync under jobs/runners.DirectRunner):
        post_backward without reduce_grads reshards the parameters and keeps every unsharded
        gradient on `_unsharded_param.grad` (fp32 / bf16 alike: no upcast to
        unsharded_accumulated_grad when the reduce dtype is the gradient's), so after the
        first round all of them, A = g*(R + sum B), are held; later rounds accumulate into
        them in place; in the last round block i's reduce-scatter frees its gradient.
    Moments (B_{-1} = R for the forward's first block; terms with an index outside the
    blocks are 0; a = A on rounds after the first, else 0; S_i = g*(R + sum_{j<i} B_j)):
        root copy-out           a + 2p*R                       (forward and backward)
        forward all-gather i    a + p*R + p*B_{i-1} + p*B_i;   copy-out i   a + p*R + 2p*B_i
      one round (rounds = 1):
        backward copy-out i     p*R + g*H + 2p*B_i + g*B_{i+1}
        backward compute i      p*R + g*H + (p + g)*B_i + p*B_{i-1} + g*B_{i+1}
        reduce-scatter in i     p*R + g*H + p*B_{i-1} + 2g*B_i
        root post-backward      (p + g)*R + g*B_0;  root reduce-scatter 2g*R
      rounds >= 2, the first (sync off; T_i = g*(H + sum_{j>i} B_j)):
        backward copy-out i     p*R + T_i + 2p*B_i
        backward compute i      p*R + T_i + (p + g)*B_i + p*B_{i-1}
        root post-backward      (p + g)*R + g*sum B
      a middle one (sync off):  A + p*R + 2p*B_i,  A + p*R + p*B_i + p*B_{i-1},  A + p*R
      the last (sync on):
        backward copy-out i     p*R + S_i + g*B_i + 2p*B_i + g*B_{i+1}
        backward compute i      p*R + S_i + (p + g)*B_i + p*B_{i-1} + g*B_{i+1}
        reduce-scatter in i     p*R + S_i + p*B_{i-1} + 2g*B_i
        root post-backward      (p + g)*R + g*B_0;  root reduce-scatter 2g*R
    Uniform blocks (3 or more), p = g, R = H, one round: 2p*R + 4p*B; with accumulation the
    next round's first all-gather usually peaks: g*(R + sum B) + 2p*R + p*B_0. Exact on a CPU
    thread where every parameter's first dimension divides by the data-parallel size (FSDP2
    pads each parameter, the units here are padded as a whole); with CUDA streams a freed
    buffer is reused only after the stream event, which can keep one more all-gather alive.
    Autograd's per-parameter gradient before it is added in place to a held one is not
    FSDP2's and not counted (one parameter's, for the length of the add).

DeepSpeed's convention (deepspeed/runtime/zero/stage3.py estimate_zero3_model_states_mem_needs:
`largest_layer_memory = 4 * largest_layer_params`, the largest single module's fp16
parameters and gradients, 2 + 2 bytes) counts one module, not a block plus the root, no
prefetch and no flat buffers: `deepspeed_largest_module` gives it for comparison.
"""

from __future__ import annotations


def reference_peak(root: float, blocks: list[float], p: float, g: float) -> float:
    big = max(blocks, default=0)
    return float(max(p * root + (p + g) * big, (p + g) * root))


def fsdp2_rounds(w: dict) -> int:
    """Accumulation rounds of one step on FSDP2: jobs/runners.DirectRunner (tp = pp = 1) runs
    grad_accum x microbatches micro-batches, gradient sync on the last only. The pipeline
    runner (tp or pp > 1) is not modelled here: 1."""
    if w.get("tp", 1) > 1 or w.get("pp", 1) > 1:
        return 1
    return int(w.get("grad_accum", 1)) * int(w.get("microbatches", 1))


def fsdp2_moments(root: float, blocks: list[float], p: float, g: float,
                  head: float | None = None, rounds: int = 1) -> dict[str, float]:
    """Every moment of the list above, by name (the largest is the peak). `head`: the root's
    parameters used after the blocks (GPT: final norm + LM head), whose gradients exist from
    the start of backward; the rest of the root's (the embeddings') only after the blocks.
    None: all of the root (an upper bound). `rounds`: micro-batches per step, gradient sync
    off on all but the last (`fsdp2_rounds`)."""
    assert rounds >= 1
    B = list(blocks)
    n = len(B)
    head = root if head is None else min(head, root)

    def b(i: int) -> float:
        return B[i] if 0 <= i < n else 0.0

    every = g * (root + sum(B))  # all unsharded gradients, held after a round without sync
    out: dict[str, float] = {}
    for k in range(min(rounds, 3)):  # rounds 2.. rounds-1 hold the same: one stands for all
        last, a = k == min(rounds, 3) - 1, every if k else 0.0
        tag = "" if rounds == 1 else ("last " if last else ("first " if k == 0 else "middle "))
        out[f"{tag}root copy-out"] = a + 2 * p * root
        for i in range(n):
            prev = root if i == 0 else b(i - 1)
            out[f"{tag}forward all-gather {i}"] = a + p * root + p * prev + p * b(i)
            out[f"{tag}forward copy-out {i}"] = a + p * root + 2 * p * b(i)
        if last:  # sync on: block i's reduce-scatter frees its gradient, keeps its input
            for i in range(n):
                held = p * root + (g * head if rounds == 1 else g * root + g * sum(B[:i]))
                own = g * b(i) if rounds > 1 else 0.0  # accumulated in earlier rounds
                out[f"{tag}backward copy-out {i}"] = held + own + 2 * p * b(i) + g * b(i + 1)
                out[f"{tag}backward compute {i}"] = \
                    held + (p + g) * b(i) + p * b(i - 1) + g * b(i + 1)
                out[f"{tag}reduce-scatter input {i}"] = held + p * b(i - 1) + 2 * g * b(i)
            out[f"{tag}root post-backward"] = (p + g) * root + g * b(0)
            out[f"{tag}root reduce-scatter"] = 2 * g * root
        elif k == 0:  # sync off: every block's gradient stays
            for i in range(n):
                held = p * root + g * head + g * sum(B[i + 1:])
                out[f"{tag}backward copy-out {i}"] = held + 2 * p * b(i)
                out[f"{tag}backward compute {i}"] = held + (p + g) * b(i) + p * b(i - 1)
            out[f"{tag}root post-backward"] = (p + g) * root + g * sum(B)
        else:
            for i in range(n):
                out[f"{tag}backward copy-out {i}"] = every + p * root + 2 * p * b(i)
                out[f"{tag}backward compute {i}"] = every + p * root + p * b(i) + p * b(i - 1)
            out[f"{tag}root post-backward"] = every + p * root
    return out


def fsdp2_peak(root: float, blocks: list[float], p: float, g: float,
               head: float | None = None, rounds: int = 1) -> float:
    return float(max(fsdp2_moments(root, blocks, p, g, head, rounds).values()))


def deepspeed_largest_module(largest_module_params: float) -> float:
    """DeepSpeed 0.19's estimator: 4 bytes (fp16 parameters + gradients) per parameter of the
    largest module."""
    return 4.0 * largest_module_params


REFERENCE_FORMULA = "max(p*Ψ_root + (p + g)*Ψ_largest_block, (p + g)*Ψ_root): the root " \
    "gathered throughout, one block's parameters + gradient; the root's own reduce-scatter last"
NATIVE_FORMULA = "FSDP2 (reshard_after_forward, default prefetch): max over the step of " \
    "p*Ψ_root + g*Ψ_head + (p + g)*Ψ_block_i + p*Ψ_block_(i-1) (backward prefetch) + " \
    "g*Ψ_block_(i+1) (retained reduce-scatter input), the forward's p*Ψ_root + " \
    "p*Ψ_prev + p*Ψ_block_i (flat all-gather buffers) and the reduce-scatter copies; with " \
    "gradient accumulation every unsharded gradient g*(Ψ_root + ΣΨ_block) held from the " \
    "first micro-batch on (sync off) (jobs/theory/gathered.py)"
