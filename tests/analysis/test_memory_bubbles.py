"""Memory measured vs predicted (error in %) and the pipeline bubble split, on synthetic traces
with known answers."""

import pytest

from devtools.oracle import analyze
from jobs import schedules
from jobs.analysis import from_records
from jobs.theory import predict
from tests.analysis.synth import end, mem, meta, span

approx = pytest.approx
DDP = {"preset": "ddp", "train": {"steps": 2}}
PP = {"preset": "pp-1f1b", "train": {"steps": 2}}


def test_memory_error_pct_against_theory():
    comps = predict(DDP)["memory"]["components"]
    want = {"params": comps["params"], "grads": comps["grads"], "optimizer": comps["optimizer"]}
    recs = {}
    for r in range(2):
        scale = 1.01 if r == 0 else 0.98
        recs[r] = [meta(r, 2, spec=DDP), span(r, 0, "step", 0, 10, cat="step"),
                   mem(r, 0, 5, **{k: round(v * scale) for k, v in want.items()},
                       activations=1000),
                   end(r, 20)]
    a = analyze(from_records(recs))
    rows = {(x["rank"], x["component"]): x for x in a["tables"]["memory"]}
    for k in want:
        assert rows[(0, k)]["predicted_bytes"] == approx(want[k])
        assert rows[(0, k)]["error_pct"] == approx(1.0, abs=1e-3)
        assert rows[(1, k)]["error_pct"] == approx(-2.0, abs=1e-3)
    assert rows[(0, "model_state")]["error_pct"] == approx(1.0, abs=1e-3)
    assert a["headline"]["memory_error_pct"] == approx(2.0, abs=1e-3)
    assert a["headline"]["peak_memory_bytes"] == sum(round(v * 1.01) for v in want.values()) \
        + 1000


def pipeline_trace(stall_us: float, pause_at: float = 5.0):
    """1F1B, p=2, m=4 exactly as the simulator lays it out (t_f = 1, t_b = 2 ms), two steps;
    in step 1 both ranks pause `stall_us` at `pause_at` ms (a stall no schedule explains)."""
    sim = schedules.simulate("1f1b", 2, 4, t_f=1.0, t_b_input=2.0, t_b_weight=0.0)
    recs = {r: [meta(r, 2, {"pp": r, "dp": 0, "tp": 0}, spec=PP)] for r in range(2)}
    for step in (0, 1):
        base = step * 100_000.0
        for rk in sim["ranks"]:
            for s in rk["spans"]:
                t0, t1 = s["start"] * 1000, s["end"] * 1000
                if step == 1 and t0 >= pause_at * 1000:
                    t0, t1 = t0 + stall_us, t1 + stall_us
                recs[rk["rank"]].append(span(rk["rank"], step, s["kind"], base + t0, base + t1,
                                             mb=s["mb"], action=s["kind"], chunk=0,
                                             stage=s["stage"]))
    return from_records(recs), sim


def test_bubble_split_without_stall_is_all_inherent():
    tr, sim = pipeline_trace(0.0)
    rows = analyze(tr)["tables"]["stage_bubbles"]
    assert [r["stage"] for r in rows] == [0, 1]
    for r, s in zip(rows, sim["ranks"], strict=True):
        assert r["measured_idle_fraction"] == approx(s["idle_fraction"])
        assert r["inherent_s"] == approx(s["idle_s"] / 1000)        # sim times are ms
        assert r["stall_s"] == approx(0.0, abs=1e-9)
        assert r["simulated"] == approx(s["idle_fraction"])
        assert r["closed_form"] == approx(1 / 5)


def test_bubble_split_attributes_a_pause_to_stall():
    tr, sim = pipeline_trace(stall_us=3000.0)   # 3 ms in step 1 (step 0 is skipped)
    a = analyze(tr)
    rows = a["tables"]["stage_bubbles"]
    for r, s in zip(rows, sim["ranks"], strict=True):
        assert r["steps"] == 1
        assert r["inherent_s"] == approx(s["idle_s"] / 1000)
        assert r["stall_s"] == approx(3e-3)
        assert r["window_s"] == approx(sim["makespan_s"] / 1000 + 3e-3)
    window = sim["makespan_s"] / 1000 + 3e-3  # the headline: the stages' mean, from the sim
    assert a["headline"]["bubble_fraction"] == approx(
        sum((s["idle_s"] / 1000 + 3e-3) / window for s in sim["ranks"]) / 2)


def test_no_pipeline_no_bubble():
    recs = {0: [meta(0, 1, spec={"preset": "ddp", "parallel": {"dp": 1},
                                 "runtime": {"nproc_per_node": 1}}),
                span(0, 0, "step", 0, 10, cat="step")]}
    a = analyze(from_records(recs))
    assert a["tables"]["stage_bubbles"] == [] and a["headline"]["bubble_fraction"] is None


def test_pipeline_without_spec_gives_measured_bubble_only():
    tr, sim = pipeline_trace(0.0)
    for r in tr.meta.values():
        r.pop("spec")
    rows = analyze(tr)["tables"]["stage_bubbles"]
    assert [r["stage"] for r in rows] == [0, 1]
    for r, s in zip(rows, sim["ranks"], strict=True):
        assert r["measured_idle_fraction"] == approx(s["idle_fraction"])
        assert r["inherent"] is None and r["simulated"] is None
