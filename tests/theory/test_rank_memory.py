"""Per-rank memory theory (jobs/theory/ranks.py): in-flight activations follow the schedule,
the transient components are labelled next to the model states, a what-if names no buffers."""

import pytest

from jobs.theory import predict
from jobs.theory.model import gpt_saved_bytes

W4 = {"runtime": {"nproc_per_node": 4}}
UNIT = 2 * 64 * 4  # mlp: micro-batch 8/4 = 2 samples x h = 64 x fp32


def per_rank(spec):
    return predict(spec)["memory"]["per_rank"]


@pytest.mark.parametrize("sched,want", [
    ("1f1b", [4 * 2 * UNIT, 3 * 2 * UNIT, 2 * 2 * UNIT, 1 * 3 * UNIT]),   # p - r in flight
    ("gpipe", [4 * 2 * UNIT, 4 * 2 * UNIT, 4 * 2 * UNIT, 4 * 3 * UNIT]),  # all m
])
def test_pp4_activations_per_rank_follow_the_schedule(sched, want):
    rows = per_rank({"preset": "pp-1f1b", "parallel": {"pp": 4, "pp_schedule": sched}, **W4})
    assert [r["activations"] for r in rows] == want
    # live receive buffers, one per kind posted ahead (hand count, tests/mp/test_recv_buffers
    # .py docstring): 1F1B rank 0 holds the gradient in its BW and the next posted (2), the
    # middle ranks also the next activation (3), the last rank one activation (1); GPipe's
    # middle ranks finish every F (no activation posted) before their first BW (2)
    want_recv = {"1f1b": [2, 3, 3, 1], "gpipe": [2, 2, 2, 1]}[sched]
    assert [r["recv_buffers"] for r in rows] == [n * UNIT for n in want_recv]


def test_busiest_components_and_gate_total():
    mem = predict({"preset": "pp-1f1b", "parallel": {"pp": 4}, **W4})["memory"]
    rows = mem["per_rank"]
    assert mem["components"]["activations"] == max(r["activations"] for r in rows)
    assert mem["per_rank_bytes"] >= max(r["total"] for r in rows)
    assert "components.recv_buffers" in mem["explain"]


def test_zero3_gathered_unit_is_one_block_params_and_grads():
    h = 64
    mem = predict({"preset": "zero3"})["memory"]
    assert mem["components"]["gathered_unit"] == 2 * (h * h + h) * 4
    assert mem["model_state_bytes"] == 16 * 4 * (h * h + h) / 2  # fp32 16 bytes x Ψ/N
    gpt = predict({"preset": "zero3", "model": {"arch": "gpt"}})
    g = gpt["memory"]["components"]["gathered_unit"]
    assert g > 2 * (12 * h * h + 12 * h) * 4  # + the root unit (embeddings, head)


def test_comm_buffers_follow_the_implementation():
    psi = 4 * (64 * 64 + 64)
    assert predict({"preset": "ddp"})["memory"]["components"]["comm_buffers"] == 0
    assert predict({"preset": "dp-ps"})["memory"]["components"]["comm_buffers"] == psi * 4
    assert predict({"preset": "zero1"})["memory"]["components"]["comm_buffers"] == psi / 2 * 4
    assert predict({"preset": "zero2"})["memory"]["components"]["comm_buffers"] == \
        psi * 1.5 * 4


def test_whatif_names_no_implementation_buffers():
    mem = predict({"params": 7_000_000_000, "dp": 64, "tp": 1, "pp": 1, "zero_stage": 2,
                   "memory_model": "16psi"})["memory"]
    assert mem["components"]["comm_buffers"] == 0 and mem["components"]["recv_buffers"] == 0
    assert mem["per_rank_bytes"] == mem["model_state_bytes"]


def test_gpt_saved_bytes_tp_and_sp():
    """Hand count for s=16, b=8, h=64, a=4, V=128, t=2 (fp32), one block, first and last."""
    s, b, h, a, v, t = 16, 8, 64, 4, 128, 2
    sbh = s * b * h
    block = 4 * (2 * sbh + 2 * sbh + 12 * sbh / t + 4 * s * b + a * b * s * s / t) + s * s
    ends = 8 * (b * s + s) + 4 * (2 * sbh + 2 * s * b + s * b * v) + 8 * s * b + 4
    got, _ = gpt_saved_bytes(s, b, h, a, v, blocks=1, first=True, last=True, tp=t)
    assert got == block + ends
    sp, _ = gpt_saved_bytes(s, b, h, a, v, blocks=1, first=True, last=True, tp=t,
                            sequence_parallel=True)
    assert sp < got


def test_recv_buffers_at_narayanan_530b_are_three_live_boundaries():
    """Narayanan 2021 Table 1, 529.6B (h 20480, 105 layers, t 8, p 35, micro-batch 1, s 2048,
    1F1B, m 280): a middle rank holds 3 receive buffers (the gradient in its BW, the next one
    posted, the next activation posted), rank 0 2 (gradients only), the last 1 (activations
    only); one buffer = b*s*h*act_bytes. Before issue 38: every receive of a step in fp32,
    2m = 560 buffers (94 GB) on a middle rank."""
    from jobs.theory.ranks import MAX_WALK_ACTIONS, pipeline_ranks
    p, h, s = 35, 20480, 2048
    w = {"arch": "gpt", "layers": 105, "hidden": h, "heads": 128, "seq_len": s, "vocab": 51200,
         "micro_batch_size": 1, "pp": p, "virtual_stages": 1, "microbatches": 280,
         "pp_schedule": "1f1b", "tp": 8, "sequence_parallel": False,
         "activation_checkpointing": True}
    for act_bytes in (4, 2):
        rows = pipeline_ranks(w, act_bytes)
        buf = 1 * s * h * act_bytes
        assert [r["recv_buffers"] for r in rows] == [2 * buf] + [3 * buf] * (p - 2) + [buf]
    # too large to walk: a bound, the walked middle-rank count (+ a B's gradients kept for W)
    big = {**w, "microbatches": MAX_WALK_ACTIONS // (3 * p) + 1}
    rows = pipeline_ranks(big, 2)
    assert {r["recv_buffers"] for r in rows} == {3 * s * h * 2}
