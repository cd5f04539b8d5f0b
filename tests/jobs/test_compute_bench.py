"""End to end: `torchrun -m jobs.compute_bench` on gloo at world size 2, tiny mlp and gpt shapes.

The summary's rate must be the FLOPs of jobs.theory.compute (counted here independently of the
job) over the times each rank recorded in its own trace: no timing asserts, only consistency.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from jobs.spec import SpecError, parse_spec
from jobs.theory.compute import layer_flops, training_flops
from tests.support.launch import torchrun

pytestmark = pytest.mark.slow

SHAPES = {"mlp": {"arch": "mlp", "hidden": 32},
          "gpt": {"arch": "gpt", "hidden": 32, "heads": 2, "seq_len": 8}}
COMPUTE = {"batch": 4, "warmup": 1, "iters": 3}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = {}
    for name, model in SHAPES.items():
        base = tmp_path_factory.mktemp(name)
        spec = {"preset": "compute-calibration", "model": model, "compute": COMPUTE,
                "runtime": {"backend": "gloo"}}
        (base / "spec.json").write_text(json.dumps(spec))
        proc = torchrun(2, ["-m", "jobs.compute_bench", "--spec", str(base / "spec.json"),
                            "--out", str(base / "run")], timeout=120)
        errs = "".join(p.read_text() for p in (base / "run").glob("error-rank*.txt"))
        assert proc.returncode == 0, proc.stderr[-3000:] + errs
        out[name] = (parse_spec(spec), base / "run", proc.stdout)
    return out


def _trace_times(run: Path, rank: int) -> list[float]:
    recs = [json.loads(line) for line in (run / f"trace-rank{rank}.jsonl").open()]
    iters = [r for r in recs if r.get("name") == "calib_iter"]
    timed = [r for r in recs if r.get("name") == "calib_timed"]
    assert len(timed) == 1 and [r["step"] for r in iters] == list(range(COMPUTE["iters"]))
    return timed[0]["times_s"]


@pytest.mark.parametrize("name", list(SHAPES))
def test_rate_is_flops_over_recorded_times(runs, name):
    spec, run, stdout = runs[name]
    s = json.loads((run / "summary.json").read_text())
    flops, formula = layer_flops(spec.model, COMPUTE["batch"])
    assert (s["kind"], s["strategy"], s["world_size"]) == ("compute_bench",
                                                           "compute-calibration", 2)
    assert (s["device"], s["dtype"], s["backend"]) == ("cpu", "float32", "gloo")
    assert s["model"]["arch"] == name and s["model"]["hidden"] == 32
    assert (s["flops_per_iter"], s["flops_formula"]) == (flops, formula) and flops > 0
    every = []
    for rank, row in enumerate(s["results"]):
        times = _trace_times(run, rank)  # what that rank wrote itself, before the gather
        assert row["rank"] == rank and row["times_s"] == pytest.approx(times, rel=1e-12)
        assert all(t > 0 for t in times)
        rates = [flops / t for t in times]
        assert row["flops_per_s"] == pytest.approx(rates, rel=1e-9)
        assert row["median_flops_per_s"] == pytest.approx(statistics.median(rates), rel=1e-9)
        assert row["min_flops_per_s"] <= row["median_flops_per_s"] <= row["max_flops_per_s"]
        every += rates
    assert len(s["results"]) == 2 and len(every) == 2 * COMPUTE["iters"]
    agg = s["flops_per_s"]
    assert s["median_flops_per_s"] == agg["median"] > 0
    assert agg["median"] == pytest.approx(statistics.median(every), rel=1e-9)
    assert (agg["min"], agg["max"]) == pytest.approx((min(every), max(every)), rel=1e-9)
    assert agg["spread"] == pytest.approx((max(every) - min(every)) / agg["median"], rel=1e-9)
    assert "GFLOP/s per rank" in stdout


def test_layer_flops_is_the_per_layer_term_of_training_flops():
    gpt = {"arch": "gpt", "layers": 6, "hidden": 64, "seq_len": 32, "vocab": 500}
    for ck in (False, True):
        k, head = (96, 16) if ck else (72, 12)  # Narayanan 2021: the head is not recomputed
        want = k * 8 * 32 * 6 * 64 ** 2 * (1 + 32 / (6 * 64) + 500 / (head * 6 * 64))
        assert training_flops(gpt, 8, ck)[0] == pytest.approx(want, rel=1e-12)
        assert layer_flops(gpt, 8, ck)[0] == pytest.approx(k * 8 * 32 * 64 ** 2 *
                                                           (1 + 32 / (6 * 64)), rel=1e-12)
    mlp = {"arch": "mlp", "layers": 3, "hidden": 10, "seq_len": 1, "vocab": 2}
    assert training_flops(mlp, 4)[0] == 3 * layer_flops(mlp, 4)[0] == 6 * 4 * 3 * 100
    with pytest.raises(ValueError, match="timed"):
        layer_flops({**mlp, "arch": "timed"}, 4)


@pytest.mark.parametrize("over, loc", [({"model": {"arch": "timed"}}, ["model", "arch"]),
                                       ({"model": {"arch": "gpt", "experts": 2}},
                                        ["model", "experts"]),
                                       ({"compute": {"dtype": "int32"}}, ["compute", "dtype"]),
                                       ({"faults": [{"kind": "crash", "ranks": [0],
                                                     "step": 1}]}, ["faults"])])
def test_spec_rules_name_the_field(over, loc):
    with pytest.raises(SpecError) as exc:
        parse_spec({"preset": "compute-calibration", **over})
    assert loc in [e["loc"] for e in exc.value.errors], exc.value.errors
