"""Megatron TP / SP (reference and native DTensor) vs a single-process run, and TP bytes."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.analysis.storage.load import load_run_dir
from tests.support.launch import run_worker

# several torchrun launches (module fixtures), slower still on a loaded 2-core box
HERE = Path(__file__).parent

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

LAYERS, B, S, H, T = 2, 4, 8, 16, 2  # tp_worker.py's model and batch, tp = world size 2
STEPS = 3


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("tp")
    return out, run_worker(HERE / "tp_worker.py", T, out)


@pytest.mark.parametrize("case", ["tp", "sp", "native-tp", "native-sp"])
def test_matches_single_process(run, case):
    _, res = run
    for r in res["ranks"]:
        assert r[case] <= 1e-5, (case, r[case])


def _ops(out, name):
    traces = load_run_dir(out / name).ranks
    assert len(traces) == T
    return {rank: [r for r in recs if r["type"] == "comm"] for rank, recs in traces.items()}


def test_tp_bytes_match_megatron_formula(run):
    out, _ = run
    s_bytes = B * S * H * 4  # one b*s*h fp32 activation
    per_op = 2 * (T - 1) / T * s_bytes
    for comms in _ops(out, "tp").values():
        assert all(c["axis"] == "tp" and c["op"] == "all_reduce" for c in comms)
        fwd = [c for c in comms if c["phase"] == "fwd"]
        bwd = [c for c in comms if c["phase"] == "bwd"]
        assert len(fwd) == len(bwd) == 2 * LAYERS * STEPS  # two g forward, two f backward
        assert {c["region"] for c in fwd} == {"g"} and {c["region"] for c in bwd} == {"f"}
        assert sum(c["bytes_sent"] for c in comms) == 4 * LAYERS * STEPS * per_op


def test_sp_replaces_all_reduce_with_gather_and_reduce_scatter(run):
    out, _ = run
    s_bytes = B * S * H * 4
    half = (T - 1) / T * s_bytes
    for comms in _ops(out, "sp").values():
        blocks = [c for c in comms if c["region"] in ("sp_gather", "sp_reduce_scatter")
                  and c["payload_bytes"] == s_bytes]
        ag = [c for c in blocks if c["op"] == "all_gather"]
        rs = [c for c in blocks if c["op"] == "reduce_scatter"]
        # per block: 2 all-gathers + 2 reduce-scatters forward and the conjugates backward;
        # one more all-gather forward before the LM head
        assert len(rs) == 4 * LAYERS * STEPS
        assert len(ag) == 4 * LAYERS * STEPS + STEPS
        assert sum(c["bytes_sent"] for c in rs) == 4 * LAYERS * STEPS * half
        assert not [c for c in comms if c["op"] == "all_reduce" and c["region"] != "sp_param_grads"]


def test_native_tp_traffic_next_to_formula(run):
    """DTensor (q, k, v fed one Replicate DTensor) issues exactly Megatron's all-reduces."""
    out, _ = run
    s_bytes = B * S * H * 4
    for comms in _ops(out, "native-tp").values():
        for phase in ("fwd", "bwd"):
            ops = [c for c in comms if c["phase"] == phase]
            assert len(ops) == 2 * LAYERS * STEPS
            assert all(c["op"] == "all_reduce" and c["payload_bytes"] == s_bytes for c in ops)


def test_native_sp_traffic_next_to_reference(run):
    """Same all-gathers / reduce-scatters as the reference; the sequence-sharded parameters'
    gradients stay Partial and are all-reduced lazily, per parameter, inside the optimizer."""
    out, _ = run
    s_bytes = B * S * H * 4
    for rank, comms in _ops(out, "native-sp").items():
        ref = _ops(out, "sp")[rank]
        big = sorted((c["op"], c["phase"]) for c in comms if c["payload_bytes"] == s_bytes)
        assert big == sorted((c["op"], c["phase"]) for c in ref
                             if c["payload_bytes"] == s_bytes)
        small = [c for c in comms if c["payload_bytes"] != s_bytes]
        assert small and all(c["op"] == "all_reduce" and c["payload_bytes"] == H * 4
                             for c in small)


@pytest.mark.parametrize("case", ["vp-tp", "vp-sp"])
def test_vocab_parallel_matches_single_process(run, case):
    _, res = run
    for r in res["ranks"]:
        assert r[case] <= 1e-5, (case, r[case])


def test_vocab_parallel_bytes(run):
    """On top of TP: the embedding's g (b*s*h forward), the head's f (b*s*h backward) and
    three b*s all-reduces in the cross-entropy (max, target logit, sum of exponentials)."""
    out, _ = run
    s_bytes = B * S * H * 4
    for rank, comms in _ops(out, "vp-tp").items():
        base = _ops(out, "tp")[rank]
        extra_fwd = sum(c["phase"] == "fwd" and c["payload_bytes"] == s_bytes for c in comms) \
            - sum(c["phase"] == "fwd" for c in base)
        extra_bwd = sum(c["phase"] == "bwd" for c in comms) - sum(c["phase"] == "bwd"
                                                                   for c in base)
        assert extra_fwd == STEPS and extra_bwd == STEPS
        ce = [c for c in comms if c["region"] == "vocab_ce"]
        assert len(ce) == 3 * STEPS and all(c["payload_bytes"] == B * S * 4 for c in ce)
