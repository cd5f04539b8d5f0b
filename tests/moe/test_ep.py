"""Mixture of experts with expert parallelism (issue 17) against a single process, and the traced
all-to-all bytes against jobs/theory/moe.py. Three torchrun launches: world 4 (ep 1, 2, 4 on
dp 4, with and without capacity dropping, dp 2 x tp 2 with ep 2, and dp 2 x pp 2 with ep 2
(1F1B) or without (GPipe)), world 2 (ep 1 and 2 on
dp 2, FSDP2 with ep 1), and world 2 with the test-only bug `ep_edp_average` planted (the gate
must fail for EP, and only for EP).

Every run trains with plain SGD (a wrong gradient scale shows; Adam would hide it) and the
auxiliary loss on; the gate (tests/support/gate.py) compares step-0 gradients (every expert
gathered), final parameters and the loss curve with one process on the same global batches."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from jobs.dims import ParallelDims
from jobs.spec import parse_spec
from jobs.theory import param_count
from jobs.theory.moe import a2a_bytes, ep_model_state, expert_params
from tests.support.gate import TOL, dumped_state, loss_err, rel_err, single_reference
from tests.support.launch import launch_by_world, multirun, read_trace

MODEL = {"arch": "gpt", "layers": 2, "hidden": 16, "heads": 2, "seq_len": 8, "vocab": 32,
         "experts": 4, "top_k": 2, "aux_loss_coef": 0.1}
CAP = {"capacity_factor": 1.0}  # C = ceil(N * 2 / 4) per rank micro-batch of N: drops happen
DROPLESS = {"capacity_factor": 0.0, "shared_expert": True, "router_bias": "1:1.5"}
HOT = 1  # the expert router_bias makes hot
SMALL_BUCKET = 0.001  # MiB: one parameter per DDP / ZeRO bucket


def spec(n: int, ep: int, model: dict, par: dict | None = None,
         train: dict | None = None, tp: int = 1) -> dict:
    return {"model": {**MODEL, **model},
            "parallel": {"dp": n // tp, "tp": tp, "ep": ep, **(par or {})},
            "train": {"steps": 3, "global_batch": 8, "optimizer": "sgd", "lr": 0.1,
                      **(train or {})},
            "runtime": {"nproc_per_node": n}}


RUNS = {
    4: [("ep1-cap", spec(4, 1, CAP, {"dp_mode": "allreduce"})),
        ("ep2-cap", spec(4, 2, CAP, {"bucket_mb": SMALL_BUCKET})),
        ("ep2-dropless", spec(4, 2, DROPLESS, {"bucket_mb": SMALL_BUCKET}, {"grad_accum": 2})),
        ("ep4-cap", spec(4, 4, CAP, {"dp_mode": "allreduce"})),
        ("ep4-dropless", spec(4, 4, DROPLESS, {"zero_stage": 1})),
        # attention tensor-parallel, MoE expert-parallel (seed 004), dp 2 x tp 2
        ("tp2-ep2-cap", spec(4, 2, CAP, {"bucket_mb": SMALL_BUCKET}, tp=2)),
        # inside a pipeline: experts over EP on each stage (1F1B), and GPipe without EP
        ("pp2-ep2-cap", spec(4, 2, CAP, {"dp": 2, "pp": 2, "microbatches": 2})),
        ("pp2-gpipe-dropless", spec(4, 1, DROPLESS, {"dp": 2, "pp": 2, "microbatches": 2,
                                                     "pp_schedule": "gpipe"}))],
    2: [("ep1-dropless", spec(2, 1, DROPLESS)),
        ("ep2-cap", spec(2, 2, CAP, {"zero_stage": 2, "bucket_mb": SMALL_BUCKET})),
        ("ep1-fsdp-cap", spec(2, 1, CAP, {"zero_stage": 3, "engine": "native"}))],
}
ALL = [(n, name) for n, runs in RUNS.items() for name, _ in runs]


@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> dict:
    return launch_by_world(tmp_path_factory, RUNS, "moe")


single = single_reference


def run_spec(n: int, name: str) -> dict:
    return dict(RUNS[n])[name]


@pytest.mark.parametrize("n, name", ALL)
def test_equals_single_process(launched, n, name):
    d = launched[n] / name
    ref = single(run_spec(n, name))
    grads, params = dumped_state(d, ref)
    assert any(".experts.3." in k for k in grads)  # every expert gathered
    assert rel_err(grads, ref["grads"]) <= TOL, name
    assert rel_err(params, ref["params"]) <= TOL, name
    summary = json.loads((d / "summary.json").read_text())
    assert loss_err(summary["loss"], ref["loss"]) <= TOL, name
    par = run_spec(n, name)["parallel"]
    if par["tp"] == 1 and par.get("pp", 1) == 1 and not par.get("zero_stage"):
        # the DP formula holds for what the DP strategy holds (ep > 1: the non-expert Ψ)
        check = summary["formula_check"]
        assert all(x == 0 for r in check["ranks"] for x in r["bytes_sent_deviation"]), name


def test_model_state_per_rank_equals_the_ep_memory_model(launched):
    """Replicated DP (no shard padding) with SGD (no optimizer state): params and grads per
    rank are the non-expert Ψ plus this rank's experts / ep, byte for byte."""
    checked = []
    for n, name in ALL:
        s = run_spec(n, name)
        p = s["parallel"]
        if p["tp"] > 1 or p.get("pp", 1) > 1 or p.get("zero_stage") or \
                p.get("engine") == "native":
            continue
        m = parse_spec(s, max_world_size=8).model
        want = ep_model_state(param_count(m), expert_params(m.layers, m.hidden, m.experts),
                              p["dp"], p["ep"], 0, bytes_optimizer=0)
        summary = json.loads((launched[n] / name / "summary.json").read_text())
        for r in summary["ranks"]:
            last = [x for x in r["memory"]["phases"] if x["phase"] == "after_step"][-1]
            assert {k: last[k] for k in want} == want, (name, r["rank"])
        checked.append(name)
    assert len(checked) == 5, checked


def moe_records(d: Path, n: int) -> list[dict]:
    return [r for rank in range(n) for r in read_trace(d, rank) if r["type"] == "moe"]


def test_drops_only_with_capacity_and_the_biased_expert_is_hot(launched):
    for n, name in ALL:
        recs = moe_records(launched[n] / name, n)
        assert recs, name
        dropped = sum(r["dropped"] for r in recs)
        assert (dropped > 0) == ("cap" in name), (name, dropped)
        if "dropless" in name:
            load = [sum(r["tokens_per_expert"][e] for r in recs) for e in range(4)]
            assert max(range(4), key=load.__getitem__) == HOT, (name, load)


def test_all_to_all_bytes_equal_theory_exactly(launched):
    for n, name in ALL:
        s = run_spec(n, name)
        ep = s["parallel"]["ep"]
        d = launched[n] / name
        traces = {r: read_trace(d, r) for r in range(n)}
        a2a = {r: [x for x in t if x["type"] == "comm" and x["op"] == "all_to_all"]
               for r, t in traces.items()}
        if ep == 1:
            assert not any(a2a.values()), name
            continue
        p = s["parallel"]
        dims = ParallelDims(dp=p["dp"], tp=p["tp"], pp=p.get("pp", 1), world_size=n)
        dp_groups = {tuple(dims.group_ranks("dp", r)) for r in range(n)}  # per (pp, tp)
        groups = [list(g[i * ep:(i + 1) * ep]) for g in sorted(dp_groups)
                  for i in range(len(g) // ep)]
        checked = 0
        for ranks in groups:
            tokens: dict = {}
            for r in ranks:
                for m in (x for x in traces[r] if x["type"] == "moe"):
                    k = (m["step"], m["microbatch"], m["layer"])
                    t = tokens.setdefault(k, [0, 0])
                    t[0] += m["tokens"]
                    t[1] += m["dropped"]
            payload: dict = {}
            for r in ranks:
                for x in a2a[r]:
                    k = (x["step"], x["microbatch"], x["layer"], x["what"] == "counts")
                    payload[k] = payload.get(k, 0) + x["payload_bytes"]
            for (step, mb, layer), (tok, dropped) in tokens.items():
                th = a2a_bytes(tokens=tok, hidden=MODEL["hidden"], top_k=MODEL["top_k"],
                               experts=MODEL["experts"], ep=ep, seq_len=MODEL["seq_len"],
                               capacity_factor=s["model"]["capacity_factor"], dropped=dropped)
                assert payload[(step, mb, layer, False)] == th["payload"], (name, step, layer)
                assert payload[(step, mb, layer, True)] == th["counts_payload"], name
                checked += 1
            # the rank x rank matrix from the ranks' own routing (their moe records): in
            # dispatch, rank r sends group rank d its kept assignments to d's experts and
            # receives from each peer the peer's kept assignments to r's experts (float32
            # rows of `hidden`); combine and the backward passes run it the other way; the
            # counts exchange moves one int64 per local expert each way. Send and receive
            # are not interchangeable: swapped, the check fails for any uneven routing.
            moe = {r: {(m["step"], m["microbatch"], m["layer"]): m for m in traces[r]
                       if m["type"] == "moe"} for r in ranks}
            per, row = MODEL["experts"] // ep, MODEL["hidden"] * 4
            uneven = 0
            for me, r in enumerate(ranks):
                for x in a2a[r]:
                    k = (x["step"], x["microbatch"], x["layer"])
                    kept = {q: [a - b for a, b in zip(moe[q][k]["tokens_per_expert"],
                                                      moe[q][k]["dropped_per_expert"],
                                                      strict=True)] for q in ranks}
                    to = [sum(kept[r][d * per:(d + 1) * per]) * row for d in range(ep)]
                    frm = [sum(kept[q][me * per:(me + 1) * per]) * row for q in ranks]
                    send, recv = {("counts", "fwd"): ([per * 8] * ep, [per * 8] * ep),
                                  ("dispatch", "fwd"): (to, frm), ("combine", "bwd"): (to, frm),
                                  ("combine", "fwd"): (frm, to), ("dispatch", "bwd"): (frm, to),
                                  }[(x["what"], x["phase"])]
                    assert x["ep_rank"] == me, name
                    assert (x["send_bytes"], x["recv_bytes"]) == (send, recv), (name, r, k)
                    assert (x["bytes_sent"], x["bytes_recv"]) == \
                        (sum(send) - send[me], sum(recv) - recv[me]), (name, r, k)
                    uneven += to != frm
            assert uneven, name  # some rank sent other amounts than it received
        steps, layers = s["train"]["steps"], MODEL["layers"] // p.get("pp", 1)  # per stage
        rounds = s["train"].get("grad_accum", 1) * p.get("microbatches", 1)
        assert checked == len(groups) * steps * rounds * layers, (name, checked)


def test_dropping_the_expert_gradient_average_fails_the_gate(tmp_path):
    """ep_edp_average divides expert gradients by the expert-DP size instead of dp: the gate
    fails for the EP run and still passes for the run without EP in the same launch."""
    runs = [("ep2", spec(2, 2, CAP)), ("ep1", spec(2, 1, CAP))]
    multirun(2, runs, tmp_path, env={"PARALAB_TEST_BUG": "ep_edp_average"})
    for name, s in runs:
        err = rel_err(torch.load(tmp_path / name / "grads-step0.pt"), single(s)["grads"])
        if name == "ep2":
            assert err > 100 * TOL, err
        else:
            assert err <= TOL, err
