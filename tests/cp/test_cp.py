"""Context parallelism (issue 17): ring attention with the load-balanced causal split against a
single process, and the traced ring bytes against jobs/theory/cp.py. Two torchrun launches:
world 4 (cp 2 on dp 4 = two data replicas with DDP, ZeRO-1 and ZeRO-2; cp 4 on dp 4 = one
replica, all-reduce and gradient accumulation; cp 2 x tp 2 and cp 2 x pp 2 with 1F1B, one
replica each), and world 2 (cp 2 on dp 2, cp 1 alongside) with the test-only bug
`cp_drop_causal_mask` planted (the gate must fail for CP, and only for CP).

Every run trains with plain SGD (a wrong gradient scale shows; Adam would hide it); the gate
(tests/support/gate.py) compares step-0 gradients, final parameters and the loss curve with one
process on the same global batches."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest
import torch

from jobs.dims import ParallelDims
from jobs.spec import AVAILABLE, SpecError, parse_spec
from jobs.theory import predict
from jobs.theory.cp import ring_bytes, ring_step_bytes, step_ring_bytes
from tests.support.gate import TOL, dumped_state, loss_err, rel_err, single_reference
from tests.support.launch import launch_by_world, multirun, read_trace

MODEL = {"arch": "gpt", "layers": 2, "hidden": 16, "heads": 2, "seq_len": 16, "vocab": 32}
SMALL_BUCKET = 0.001  # MiB: one parameter per DDP bucket


def spec(dp: int, cp: int, par: dict | None = None, train: dict | None = None,
         model: dict | None = None) -> dict:
    par = {"dp": dp, "cp": cp, **(par or {})}
    return {"model": {**MODEL, **(model or {})}, "parallel": par,
            "train": {"steps": 3, "global_batch": 4, "optimizer": "sgd", "lr": 0.1,
                      **(train or {})},
            "runtime": {"nproc_per_node": dp * par.get("tp", 1) * par.get("pp", 1)}}


RUNS = {
    4: [("cp2-dp2", spec(4, 2, {"bucket_mb": SMALL_BUCKET})),
        ("cp4-accum", spec(4, 4, {"dp_mode": "allreduce"}, {"grad_accum": 2},
                           {"seq_len": 32})),
        ("cp2-zero1", spec(4, 2, {"zero_stage": 1})),
        ("cp2-tp2", spec(2, 2, {"tp": 2})),
        ("cp2-zero2", spec(4, 2, {"zero_stage": 2})),
        ("cp2-pp2", spec(2, 2, {"pp": 2, "microbatches": 2, "pp_schedule": "1f1b"}))],
}
ALL = [(n, name) for n, runs in RUNS.items() for name, _ in runs]


@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> dict:
    return launch_by_world(tmp_path_factory, RUNS, "cp")


single = single_reference


def run_spec(n: int, name: str) -> dict:
    return dict(RUNS[n])[name]


@pytest.mark.parametrize("n, name", ALL)
def test_equals_single_process(launched, n, name):
    d = launched[n] / name
    ref = single(run_spec(n, name))
    grads, params = dumped_state(d, ref)
    assert rel_err(grads, ref["grads"]) <= TOL, name
    assert rel_err(params, ref["params"]) <= TOL, name
    summary = json.loads((d / "summary.json").read_text())
    assert loss_err(summary["loss"], ref["loss"]) <= TOL, name


def cp_records(d, n: int) -> dict:
    return {r: [x for x in read_trace(d, r) if x.get("axis") == "cp" and x["type"] == "comm"]
            for r in range(n)}


@pytest.mark.parametrize("n, name", ALL)
def test_ring_bytes_equal_theory_exactly(launched, n, name):
    s = parse_spec(run_spec(n, name), max_world_size=8)
    m, p, t = s.model, s.parallel, s.train
    rounds = t.grad_accum * p.microbatches
    mb = t.global_batch // (p.dp // p.cp) // rounds
    recs = cp_records(launched[n] / name, n)
    for r, rs in recs.items():
        layers = sorted({x["layer"] for x in rs})  # this rank's pipeline stage
        assert len(layers) == m.layers // p.pp, (name, r, layers)
        got: dict = defaultdict(lambda: defaultdict(int))
        recv: dict = defaultdict(lambda: defaultdict(int))
        per_step: dict = defaultdict(int)
        for x in rs:
            k = (x["step"], x["microbatch"], x["layer"], x["phase"], x["cp_step"])
            (got if x["op"] == "send" else recv)[k][x["what"]] += x["payload_bytes"]
            per_step[x["step"]] += x["bytes_sent"]
        keys = {(st, i, layer, ph, c) for st in range(t.steps) for i in range(rounds)
                for layer in layers for ph in ("fwd", "bwd") for c in range(p.cp)}
        # by hand: a rank holds mb sequences of seq_len / cp tokens, hidden / tp wide, float32;
        # ring step c passes K and V on (not the last step: every block has been seen), and
        # backward also passes the dK, dV accumulators on every step (the last one home)
        block = mb * (m.seq_len // p.cp) * (m.hidden // p.tp) * 4
        hand = {k: {w: block for w in ("k", "v", "dk", "dv")
                    if (w in ("dk", "dv") and k[3] == "bwd") or (w in ("k", "v") and
                                                                 k[4] < p.cp - 1)}
                for k in keys}
        hand = {k: v for k, v in hand.items() if v}  # the last forward step sends nothing
        assert {k: dict(v) for k, v in got.items()} == hand, (name, r)  # sent
        assert {k: dict(v) for k, v in recv.items()} == hand, (name, r)  # received
        want = {k: ring_step_bytes(batch=mb, seq_len=m.seq_len, hidden=m.hidden, cp=p.cp,
                                   phase=k[3], cp_step=k[4], tp=p.tp) for k in keys}
        assert {k: dict(v) for k, v in got.items()} == \
            {k: {w: b for w, b in v.items() if b} for k, v in want.items()
             if any(v.values())}, (name, r)
        step_total = step_ring_bytes(layers=len(layers), rounds=rounds, micro_batch=mb,
                                     seq_len=m.seq_len, hidden=m.hidden, cp=p.cp, tp=p.tp)
        assert dict(per_step) == {st: step_total for st in range(t.steps)}, (name, r)
        # by hand: per block and round (cp-1) K+V passes forward, as many backward, and cp
        # dK+dV passes: (6 cp - 4) blocks
        assert per_step[0] == len(layers) * rounds * (6 * p.cp - 4) * block, (name, r)
        # predict()'s cp axis (what the advisor and the sweep page price) is what this rank
        # was measured to send in a step of this run
        assert predict(s)["comm"]["components"]["cp"] == per_step[0], name


def test_sends_pair_with_receives_around_the_ring(launched):
    for n, name in ALL:
        p = run_spec(n, name)["parallel"]
        cp = p["cp"]
        dims = ParallelDims(dp=p["dp"], tp=p.get("tp", 1), pp=p.get("pp", 1), world_size=n)
        recs = cp_records(launched[n] / name, n)
        for r, rs in recs.items():
            dp_group = dims.group_ranks("dp", r)  # CP: cp consecutive ranks of the DP group
            i = dp_group.index(r)
            group = dp_group[i - i % cp:i - i % cp + cp]
            nxt = group[(group.index(r) + 1) % cp]
            sends = sorted((x["step"], x["microbatch"], x["layer"], x["phase"], x["cp_step"],
                            x["what"], x["payload_bytes"]) for x in rs if x["op"] == "send")
            assert {x["peer"] for x in rs if x["op"] == "send"} == {nxt}, name
            recvs = sorted((x["step"], x["microbatch"], x["layer"], x["phase"], x["cp_step"],
                            x["what"], x["payload_bytes"]) for x in recs[nxt]
                           if x["op"] == "recv" and x["peer"] == r)
            assert sends == recvs and sends, (name, r)


def test_ring_steps_are_spans_and_the_causal_work_is_balanced(launched):
    """cp spans per block and phase, one per ring step; every rank attends 2 cp + 1 block pairs
    per block (the two diagonals and one full pair at step 0, two pairs at every later step)."""
    for n, name in ALL:
        cp = run_spec(n, name)["parallel"]["cp"]
        for r in range(n):
            spans = [x for x in read_trace(launched[n] / name, r)
                     if x["type"] == "span" and x["name"] == "cp.step"]
            pairs: dict = defaultdict(int)
            steps: dict = defaultdict(set)
            for x in spans:
                k = (x["step"], x["microbatch"], x["layer"], x["phase"])
                pairs[k] += x["blocks"]
                steps[k].add(x["cp_step"])
            assert spans and set(pairs.values()) == {2 * cp + 1}, (name, r, set(pairs.values()))
            assert all(v == set(range(cp)) for v in steps.values()), name


def test_dropping_the_causal_mask_fails_the_gate(tmp_path):
    """cp_drop_causal_mask attends the diagonal block pairs unmasked: the gate fails for the CP
    run and still passes for the run without CP in the same launch."""
    runs = [("cp2", spec(2, 2)), ("cp1", spec(2, 1))]
    multirun(2, runs, tmp_path, env={"PARALAB_TEST_BUG": "cp_drop_causal_mask"})
    for name, s in runs:
        err = rel_err(torch.load(tmp_path / name / "grads-step0.pt"), single(s)["grads"])
        if name == "cp2":
            assert err > 100 * TOL, err
        else:
            assert err <= TOL, err


def test_theory_formula():
    r = ring_bytes(batch=2, seq_len=16, hidden=8, cp=4)
    assert r["block"] == 2 * 4 * 8 * 4
    assert r["total"] == (6 * 4 - 4) * r["block"]
    with pytest.raises(ValueError, match="2\\*cp"):
        ring_bytes(batch=1, seq_len=12, hidden=8, cp=4)


def _errors(data: dict) -> list[tuple]:
    with pytest.raises(SpecError) as e:
        parse_spec(data, max_world_size=8)
    return [(tuple(x["loc"]), x["msg"]) for x in e.value.errors]


@pytest.mark.parametrize("change, loc, words", [
    ({"model": {"seq_len": 12}}, ("model", "seq_len"), "2*cp = 8"),
    ({"parallel": {"dp": 2, "cp": 4}, "runtime": {"nproc_per_node": 2}}, ("parallel", "cp"),
     "must divide dp"),
    ({"parallel": {"engine": "native"}}, ("parallel", "engine"), "no native engine"),
    ({"parallel": {"dp": 2, "cp": 2, "tp": 2, "sequence_parallel": True}},
     ("parallel", "sequence_parallel"), "sequence parallelism"),
    ({"parallel": {"dp": 2, "cp": 2, "tp": 2, "vocab_parallel": True}},
     ("parallel", "vocab_parallel"), "vocabulary parallelism"),
    ({"model": {"experts": 2}}, ("model", "experts"), "mixture of experts"),
    ({"parallel": {"zero_stage": 3}}, ("parallel", "zero_stage"), "ZeRO-3"),
    ({"parallel": {"dp_mode": "ps"}}, ("parallel", "dp_mode"), "all-reduce"),
    ({"model": {"arch": "mlp"}}, ("model", "arch"), "arch 'gpt'"),
])
def test_spec_refuses_what_cp_does_not_support(change, loc, words):
    base = spec(4, 4)
    data = {k: {**base[k], **change.get(k, {})} for k in base}
    errs = _errors(data)
    assert any(e[0] == loc and words in e[1] for e in errs), errs


def test_preset_and_batch_rule():
    s = parse_spec({"preset": "cp"}, require_available=True)
    assert (s.parallel.dp, s.parallel.cp, s.strategy) == (2, 2, "cp")
    assert s.strategy in AVAILABLE
    assert parse_spec(spec(4, 2), max_world_size=8).strategy == "ddp+cp"
    assert parse_spec(spec(4, 2, {"zero_stage": 1}), max_world_size=8).strategy == "zero1+cp"
    assert parse_spec(spec(2, 2, {"tp": 2}), max_world_size=8).strategy == "tp+cp"
    # cp ranks of a group share samples: the batch splits over dp / cp replicas only
    parse_spec(spec(4, 4, train={"global_batch": 1}), max_world_size=8)
    assert any("(dp/cp)" in m for _, m in _errors(spec(4, 2, train={"global_batch": 1})))


def test_each_transfer_is_in_flight_across_its_ring_steps_attention(launched):
    """The K / V of step t + 1 are posted before step t's attention span opens and waited after
    it closes (ordering on one rank's clock, not a timing): the send / recv overlap compute."""
    for n, name in ALL:
        for r in range(n):
            trace = read_trace(launched[n] / name, r)
            spans = {(x["step"], x["microbatch"], x["layer"], x["phase"], x["cp_step"]): x
                     for x in trace if x["type"] == "span" and x["name"] == "cp.step"}
            checked = 0
            for x in trace:
                if x["type"] != "comm" or x.get("axis") != "cp" or x["what"] not in ("k", "v"):
                    continue
                sp = spans[(x["step"], x["microbatch"], x["layer"], x["phase"], x["cp_step"])]
                assert x["ts_ns"] <= sp["ts_ns"], (name, r, x)
                assert x["ts_ns"] + x["dur_ns"] >= sp["ts_ns"] + sp["dur_ns"], (name, r, x)
                checked += 1
            assert checked, (name, r)


def test_the_gantt_draws_every_ring_step_and_its_transfers(launched):
    """The dashboard's Gantt (backend/services/gantt.py, the run page's chart): on every rank's
    compute lane one labelled segment per ring step and phase inside the block's forward / backward,
    and on its `comm cp` lane the K / V (dK / dV) sends and receives, for cp = 2 and 4."""
    from backend.services.gantt import columns, gantt
    from jobs.analysis import load_run_dir

    for name in ("cp2-dp2", "cp4-accum"):
        cp = run_spec(4, name)["parallel"]["cp"]
        g = gantt(columns(load_run_dir(launched[4] / name)), step=0, max_spans=10 ** 6)
        lanes = {ln["id"]: ln for ln in g["lanes"]}
        seen: dict = defaultdict(set)
        seg = g["segments"]
        for lane, key in zip(seg["lane"], seg["key"], strict=True):
            seen[(lanes[lane]["rank"], lanes[lane]["channel"])].add(g["keys"][key])
        for r in range(4):
            want = {f"ring {ph} step {t}" for ph in ("fwd", "bwd") for t in range(cp)}
            assert want <= seen[(r, "compute")], (name, r, seen[(r, "compute")])
            assert {"send k", "recv k", "send v", "recv v", "send dk", "recv dv"} <= \
                seen[(r, "comm cp")], (name, r)


@pytest.mark.parametrize("n, name", ALL)
def test_activations_per_rank_equal_the_cp_memory_model(launched, n, name):
    """The saved-tensor counter's peak per rank equals predict()'s activations for a CP rank
    (its seq_len / cp tokens, ring attention's output and log-sum-exp instead of the scores:
    jobs.theory.model.gpt_saved_bytes) exactly."""
    from jobs.analysis import analyze_folder

    a = analyze_folder(launched[n] / name, parse_spec(run_spec(n, name), max_world_size=8))
    rows = [r for r in a["tables"]["memory"] if r["component"] == "activations"]
    assert {r["rank"] for r in rows} == set(range(n)), name
    for r in rows:
        m, p = r["measured_bytes"], r["predicted_bytes"]
        assert m and m == p, (name, r["rank"], m, p)
