"""Data-parallel family (issue 3): correctness against a single process, communication volumes
and memory against the seeds' formulas, read from the traces. Two torchrun launches (world
sizes 2 and 4) run every strategy x engine back to back inside one process group each.

The correctness gate (issue 12, tests/support/gate.py): step-0 gradients (gathered to full
shape), final parameters and losses of every run against a single process, with Adam and with
plain SGD (which, unlike Adam, sees a missing 1/dp or 1/m); bf16 against a bf16 single process."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest
import torch

from jobs.spec import parse_spec
from tests.support.gate import TOL, loss_err, reference, rel_err
from tests.support.launch import multirun, read_trace

H, L, STEPS, GB = 16, 3, 3, 8
PSI = L * H * (H + 1)  # 816: every layer's count divisible by 4, so no shard padding
SMALL_BUCKET = 0.001   # MiB: one parameter per bucket
SGD = {"optimizer": "sgd", "lr": 0.1}

REF = {"ps": {"dp_mode": "ps"}, "allreduce": {"dp_mode": "allreduce"},
       "ddp": {"dp_mode": "ddp", "bucket_mb": SMALL_BUCKET},
       "zero1": {"zero_stage": 1, "bucket_mb": SMALL_BUCKET},
       "zero2": {"zero_stage": 2, "bucket_mb": SMALL_BUCKET},
       "zero3": {"zero_stage": 3}}
NATIVE = {"ddp": {"dp_mode": "ddp", "bucket_mb": SMALL_BUCKET}, "zero1": {"zero_stage": 1},
          "zero2": {"zero_stage": 2}, "zero3": {"zero_stage": 3}}


def spec(n: int, par: dict, train: dict | None = None, engine: str = "reference",
         hidden: int = H) -> dict:
    return {"model": {"arch": "mlp", "hidden": hidden, "layers": L},
            "parallel": {"dp": n, "engine": engine, **par},
            "train": {"steps": STEPS, "global_batch": GB, **(train or {})},
            "runtime": {"nproc_per_node": n}}


def runs_for(n: int) -> list[tuple[str, dict]]:
    runs = [(f"ref-{k}", spec(n, v)) for k, v in REF.items()]
    runs += [(f"native-{k}", spec(n, v, engine="native")) for k, v in NATIVE.items()]
    runs += [(f"sgd-ref-{k}", spec(n, v, SGD)) for k, v in REF.items()]
    runs += [(f"sgd-native-{k}", spec(n, v, SGD, engine="native")) for k, v in NATIVE.items()]
    if n == 4:  # h = 5: 30 parameters per layer, shards padded to a multiple of 4
        runs += [(f"pad-{k}", spec(n, REF[k], hidden=5)) for k in ("zero1", "zero2", "zero3")]
    if n == 2:
        bf = {"precision": "bf16"}
        runs += [(f"bf16-{k}", spec(n, REF[k], bf)) for k in ("allreduce", "ddp", "zero1",
                                                               "zero2", "zero3")]
        runs += [(f"bf16-native-{k}", spec(n, NATIVE[k], bf, engine="native"))
                 for k in ("zero2", "zero3")]  # FSDP2 MixedPrecisionPolicy(bf16, bf16)
        runs += [(f"bf16g-{k}", spec(n, REF[k], {**bf, "fp32_grads": True}))
                 for k in ("ddp", "zero1", "zero2", "zero3")]
        runs += [(f"accum-{k}", spec(n, REF[k], {"grad_accum": 2}))
                 for k in ("ddp", "zero1", "zero2", "zero3")]
        runs += [("ckpt-ddp", spec(n, REF["ddp"], {"activation_checkpointing": True}))]
        runs += [(f"sgd-accum-{k}", spec(n, REF[k], {**SGD, "grad_accum": 2}))
                 for k in ("ddp", "zero2", "zero3")]
    return runs


@pytest.fixture(scope="module", params=[2, 4])
def world(request, tmp_path_factory):
    n = request.param
    out = tmp_path_factory.mktemp(f"dp{n}")
    multirun(n, runs_for(n), out)
    return n, out


def single_process(train: dict | None = None, hidden: int = H) -> dict:
    """The same global batches on one process (tests/support/gate.py)."""
    s = parse_spec(spec(1, {}, train, hidden=hidden) | {"parallel": {"dp": 1}},
                   max_world_size=1 << 30)
    return reference(s)


def params(run: Path) -> dict[str, torch.Tensor]:
    return torch.load(run / "params-final.pt")


def grads(run: Path) -> dict[str, torch.Tensor]:
    return torch.load(run / "grads-step0.pt")


def losses(run: Path) -> list[float]:
    return json.loads((run / "summary.json").read_text())["loss"]


GATED = ("ref-", "native-", "accum-", "ckpt-")


def gate(out: Path, names: list[str], ref: dict, curves: bool) -> list[tuple]:
    """(run, what, error) for every comparison over TOL (all runs, so a failure names every
    strategy it touches)."""
    bad = []
    for name in names:
        errs = {"grads": rel_err(grads(out / name), ref["grads"]),
                "params": rel_err(params(out / name), ref["params"])}
        if curves:
            errs["loss"] = loss_err(losses(out / name), ref["loss"])
        bad += [(name, k, e) for k, e in errs.items() if not e <= TOL]
    return bad


def test_fp32_equals_single_process(world):
    """Adam: step-0 gradients and final parameters of every fp32 run equal one process."""
    n, out = world
    names = [name for name, _ in runs_for(n) if name.startswith(GATED)]
    assert not gate(out, names, single_process(), curves=False)


def test_sgd_equals_single_process(world):
    """Plain SGD: gradients, parameters and the loss curve of every strategy x engine."""
    n, out = world
    names = [name for name, _ in runs_for(n) if name.startswith("sgd-")]
    assert not gate(out, names, single_process(SGD), curves=True)


def test_engines_agree_and_losses_match(world):
    n, out = world
    ls = {name: losses(out / name) for name, _ in runs_for(n)
          if name.startswith(("ref-", "native-"))}
    ref = single_process()
    for name, curve in ls.items():
        assert loss_err(curve, ref["loss"]) <= TOL, name
    for k in NATIVE:
        assert rel_err(params(out / f"native-{k}"), params(out / f"ref-{k}")) <= TOL


BF16_GRAD_TOL = 1e-2  # bf16 keeps 8 mantissa bits (eps 3.9e-3); measured 2.0e-3
BF16_MOVE_TOL = 5e-3  # reference engine: final parameters vs the bf16 single process, as a
# fraction of how far that process moved them (measured 9e-4)
FSDP2_MOVE_TOL = 0.1  # FSDP2's own mixed precision vs fp32, same measure (measured 3e-2)


def test_bf16_equals_bf16_single_process(world):
    """bf16 compute with fp32 masters vs a bf16 single process (the Single strategy: same
    compute, fp32 masters), not vs fp32 with a bound that a frozen run passes. Tolerances are
    fractions of how far the reference moved the parameters, so a run whose parameters never
    move fails (its error is 100 % of the movement)."""
    n, out = world
    if n != 2:
        pytest.skip("bf16 variants run at world size 2 only (time budget)")
    fp32 = single_process()
    for name, s in runs_for(n):
        if not name.startswith("bf16"):
            continue
        ref = single_process(s["train"])
        init = single_process({**s["train"], "steps": 1, "lr": 0.0})["params"]
        assert rel_err(grads(out / name), ref["grads"]) <= BF16_GRAD_TOL, name
        if "native" in name:  # FSDP2 MixedPrecisionPolicy rounds differently: vs fp32
            moved = rel_err(fp32["params"], init)
            err = rel_err(params(out / name), fp32["params"])
            assert err <= FSDP2_MOVE_TOL * moved, (name, err, moved)
        else:
            moved = rel_err(ref["params"], init)
            err = rel_err(params(out / name), ref["params"])
            assert err <= BF16_MOVE_TOL * moved, (name, err, moved)


def comm_records(run: Path, rank: int) -> list[dict]:
    return [r for r in read_trace(run, rank) if r["type"] == "comm" and r["axis"] == "dp"
            and r["step"] >= 0]


def test_reference_bytes_match_seeds(world):
    n, out = world
    b = 4 * PSI  # fp32 bytes of all parameters
    ring = Fraction(n - 1, n)
    expect = {"allreduce": 2 * ring * b, "ddp": 2 * ring * b, "zero1": 2 * ring * b,
              "zero2": 2 * ring * b, "zero3": 3 * ring * b}
    for k, per_step in expect.items():
        for rank in range(n):
            recs = comm_records(out / f"ref-{k}", rank)
            for step in range(STEPS):
                sent = sum(Fraction(r["bytes_sent"]) for r in recs if r["step"] == step)
                assert sent == per_step, (k, rank, step, sent, per_step)
    for rank in range(n):  # parameter server (seed 001): root (N-1)Ψ each way, workers Ψ
        recs = comm_records(out / "ref-ps", rank)
        for step in range(STEPS):
            sent = sum(r["bytes_sent"] for r in recs if r["step"] == step)
            recv = sum(r["bytes_recv"] for r in recs if r["step"] == step)
            want = (n - 1) * b if rank == 0 else b
            assert (sent, recv) == (want, want), (rank, step)


def test_conservation(world):
    """Every gradient element reduced exactly once per step; every shard gathered the
    configured number of times (ZeRO-1/2 once, ZeRO-3 twice: forward and backward)."""
    n, out = world
    b = 4 * PSI
    for k in ("allreduce", "ddp", "zero1", "zero2", "zero3"):
        recs = comm_records(out / f"ref-{k}", 0)
        for step in range(STEPS):
            red = [r for r in recs if r["step"] == step
                   and r["op"] in ("all_reduce", "reduce_scatter")]
            assert sum(r["payload_bytes"] for r in red) == b, (k, step)
            keys = [r.get("bucket", r.get("unit", r.get("param"))) for r in red]
            assert len(keys) == len(set(keys)), (k, step, keys)
            gat = [r for r in recs if r["step"] == step and r["op"] == "all_gather"]
            times = {"zero1": 1, "zero2": 1, "zero3": 2}.get(k, 0)
            assert sum(r["payload_bytes"] for r in gat) == times * b, (k, step)
    for rec in comm_records(out / "ref-zero2", 0):  # gloo moves a full all-reduce: shown too
        if rec["op"] == "reduce_scatter":
            assert rec["backend_op"] == "all_reduce"
            assert rec["backend_bytes_sent"] == 2 * rec["bytes_sent"]


def mem_after_step(run: Path, rank: int) -> dict:
    return [r for r in read_trace(run, rank) if r["type"] == "mem"
            and r.get("phase") == "after_step"][-1]


def test_reference_memory_matches_seeds(world):
    n, out = world
    P = PSI
    fp32 = {"allreduce": (4 * P, 4 * P, 8 * P), "ddp": (4 * P, 4 * P, 8 * P),
            "zero1": (4 * P, 4 * P, 8 * P // n), "zero2": (4 * P, 4 * P // n, 8 * P // n),
            "zero3": (4 * P // n, 4 * P // n, 8 * P // n)}
    for k, want in fp32.items():
        for rank in range(n):
            m = mem_after_step(out / f"ref-{k}", rank)
            assert (m["params"], m["grads"], m["optimizer"]) == want, (k, rank)
    for rank in range(n):  # ZeRO-2: full bucket gradients live only until their reduce-
        # scatter completes (on a starved CPU that can be the end of backward, so the bound
        # is the full gradients + the shard + the in-flight outputs), then only the shard
        m = [r for r in read_trace(out / "ref-zero2", rank) if r.get("phase") == "after_backward"]
        assert all(4 * H * H <= r["grads_peak"] <= 4 * PSI + 2 * 4 * PSI // n for r in m)
        assert all(r["grads"] == 4 * PSI // n for r in m)
    for rank in range(n):
        m = mem_after_step(out / "ref-ps", rank)
        assert m["optimizer"] == (8 * P if rank == 0 else 0)
    if n == 2:  # the seeds' 16Ψ model (bf16 params/grads, fp32 master+m+v) and 20Ψ
        bf = {"ddp": (2 * P, 2 * P, 12 * P), "zero1": (2 * P, 2 * P, 12 * P // n),
              "zero2": (2 * P, 2 * P // n, 12 * P // n),
              "zero3": (2 * P // n, 2 * P // n, 12 * P // n)}
        for k, (p, g, o) in bf.items():
            m = mem_after_step(out / f"bf16-{k}", 0)
            assert (m["params"], m["grads"], m["optimizer"]) == (p, g, o), k
            m = mem_after_step(out / f"bf16g-{k}", 0)
            sharded = 1 if k == "ddp" else n
            assert (m["params"], m["grads"], m["optimizer"]) == (p, g, o + 4 * P // sharded), k


def test_summary_formula_check(world):
    """The summary puts the seeds' formulas next to the measured figures: zero deviation on
    the reference engine; native engines shown with their deviation explained."""
    n, out = world
    for k in REF:
        fc = json.loads((out / f"ref-{k}" / "summary.json").read_text())["formula_check"]
        assert fc["psi"] == PSI and fc["padding_elems"] == 0
        for row in fc["ranks"]:
            assert row["bytes_sent_deviation"] == [0.0] * STEPS, (k, row["rank"])
            assert set(row["memory_deviation"].values()) == {0}, (k, row)
    if n == 2:  # accumulation (2 rounds): ZeRO-2/3 reduce every round, formula says so
        for k in ("ddp", "zero1", "zero2", "zero3"):
            fc = json.loads((out / f"accum-{k}" / "summary.json").read_text())["formula_check"]
            assert all(r["bytes_sent_deviation"] == [0.0] * STEPS for r in fc["ranks"]), k
    for k in NATIVE:
        s = json.loads((out / f"native-{k}" / "summary.json").read_text())
        fc = s["formula_check"]
        assert fc["engine"] == "native" and fc["explanation"]
        assert all(len(r["bytes_sent_per_step"]) == STEPS for r in fc["ranks"])
    z1 = json.loads((out / "native-zero1" / "summary.json").read_text())
    owned = z1["ranks"][0]["layout"]["owned_elems_per_rank"]
    assert sum(owned) == PSI and len(owned) == n  # whole-parameter shards: shown as they are
    sent = [r["bytes_sent_per_step"][2] for r in z1["formula_check"]["ranks"]]  # step 1: +DDP
    # bucket-order broadcasts after the rebuild
    ring = 2 * (n - 1) / n * 4 * PSI
    assert sent == [ring + 4 * o for o in owned]  # all-reduce + broadcast of own parameters
    ddp = json.loads((out / "ref-ddp" / "summary.json").read_text())
    ckpt = json.loads((out / "ckpt-ddp" / "summary.json").read_text()) if n == 2 else None
    act = ddp["ranks"][0]["memory"]["peak_bytes"]["activations"]
    assert act > 0
    if ckpt:  # an MLP block saves only its input, which checkpointing saves too: no gain
        assert ckpt["ranks"][0]["memory"]["peak_bytes"]["activations"] <= act


def test_activation_bytes_and_checkpointing():
    """Saved-tensor hooks count what autograd keeps for backward; checkpointing the blocks
    of a GPT keeps only their inputs."""
    from jobs.memory import SavedTensorCounter, param_storages
    from jobs.models import gpt
    from jobs.parallel.checkpoint import apply_activation_checkpointing
    s = parse_spec({"model": {"arch": "gpt", "hidden": 16, "layers": 2, "heads": 2,
                              "seq_len": 8, "vocab": 32},
                    "runtime": {"nproc_per_node": 1}}, max_world_size=1 << 30)
    counted = []
    for ckpt in (False, True):
        m = gpt.build(s.model, 0)
        if ckpt:
            apply_activation_checkpointing(m)
        c = SavedTensorCounter(param_storages(m))
        x, y = gpt.batch(s.model, 4, 0, 0)
        with c.hooks():
            loss = gpt.loss_fn(m(x), y)
        loss.backward()
        counted.append(c.bytes)
    assert 0 < counted[1] < counted[0]


def test_uneven_shards_padded_and_reported(world):
    """h = 5 on 4 ranks: every bucket / unit (30 and 5 elements) is padded to a multiple of 4.
    Results still equal the single process; the summary reports the padding, and the memory
    is the formula applied to the padded size."""
    n, out = world
    if n != 4:
        pytest.skip("padding runs at world size 4 only (at 2 these sizes divide evenly)")
    ref = single_process(hidden=5)
    psi = L * 5 * 6
    for k in ("zero1", "zero2", "zero3"):
        run = out / f"pad-{k}"
        assert rel_err(params(run), ref["params"]) <= TOL, k
        assert rel_err(grads(run), ref["grads"]) <= TOL, k
        fc = json.loads((run / "summary.json").read_text())["formula_check"]
        pad = fc["padding_elems"]
        assert fc["psi"] == psi and pad > 0, k
        P = psi + pad
        want = {"zero1": (4 * P, 4 * P, 8 * P // n), "zero2": (4 * P, 4 * P // n, 8 * P // n),
                "zero3": (4 * P // n, 4 * P // n, 8 * P // n)}[k]
        m = mem_after_step(run, 0)
        assert (m["params"], m["grads"], m["optimizer"]) == want, (k, pad)
