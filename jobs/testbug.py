"""TEST-ONLY fault injection: proves that the correctness gate can fail.

`PARALAB_TEST_BUG=<name>` in a rank's environment plants one known gradient-scale bug; it is
read here and nowhere else, and never set by the service. Bugs:

    drop_dp_average   gradients are summed over the DP replicas instead of averaged (the 1/dp
                      of DDP / all-reduce / parameter server / ZeRO / FSDP2 is dropped)
    drop_mb_average   the loss of each micro-batch / accumulation round is not divided by the
                      number of rounds (the 1/m of gradient accumulation and pipelines)
    ep_edp_average    expert gradients (expert parallelism) are averaged over the expert-DP
                      group (dp/ep ranks) instead of divided by dp (jobs/parallel/expert.py)
    cp_drop_causal_mask  ring attention (jobs/parallel/context.py) attends the diagonal block
                      pairs without the causal mask: queries see later tokens of their chunk
    ckpt_drop_optimizer  a resumed run loads the parameters but not the optimizer state
                      (jobs/ckpt.py): tests/ckpt shows the resume test then fails

tests/jobs/test_gate_can_fail.py runs strategies with each bug and asserts the gate fails.
"""

from __future__ import annotations

import os

BUGS = ("drop_dp_average", "drop_mb_average", "ckpt_drop_optimizer", "ep_edp_average",
        "cp_drop_causal_mask")


def injected(name: str) -> bool:
    assert name in BUGS, name
    return os.environ.get("PARALAB_TEST_BUG") == name


def dp_divisor(n: int) -> int:
    """What a DP strategy divides its summed gradients by: n, or 1 under drop_dp_average."""
    return 1 if injected("drop_dp_average") else n


def mb_divisor(rounds: int) -> int:
    """What each micro-batch's loss is divided by: rounds, or 1 under drop_mb_average."""
    return 1 if injected("drop_mb_average") else rounds


def ep_divisor(dp: int, edp: int) -> int:
    """What summed expert gradients are divided by: dp, or edp (= dp / ep) under
    ep_edp_average."""
    return edp if injected("ep_edp_average") else dp
