"""End to end: `torchrun -m jobs.collective_bench` on gloo at world sizes 2 and 4.

Three launches in all (module-scoped), each sweeping small sizes: every op is verified and gets
nccl-tests' algbw / busbw; every point-to-point all-reduce algorithm equals the backend's own and
reproduces seed 000's table (bytes per rank, total, steps) from its trace files alone.
No timing asserts.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from _commtable import ROOT, assert_seed_table, load_traces, p2p_records, point_steps, torchrun

from jobs import commbytes
from jobs.collective_bench import main as bench_main
from jobs.spec import COLLECTIVE_OPS

pytestmark = pytest.mark.slow

# 3072 B and 196608 B: 768 and 49152 float32 (1536 and 98304 bfloat16), divisible by 2, 3, 4
SWEEP = {"min_bytes": 3072, "max_bytes": 196608, "factor": 64, "warmup": 0, "iters": 2}
ALGOS = ["builtin", "naive", "ps", "ring", "tree", "butterfly"]


def launch(out: Path, world: int, collective: dict) -> tuple[Path, subprocess.CompletedProcess]:
    out.mkdir(parents=True, exist_ok=True)
    spec = {"name": out.name, "kind": "collective_bench",
            "runtime": {"nproc_per_node": world, "backend": "gloo"}, "collective": collective}
    (out / "spec.json").write_text(json.dumps(spec))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = torchrun(world, ["-m", "jobs.collective_bench", "--spec", str(out / "spec.json"),
                            "--out", str(out / "run")], env=env)
    return out / "run", proc


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("collectives")
    plan = {
        "w2": (2, {"ops": list(COLLECTIVE_OPS), "algorithms": ALGOS, "ps_placement": "rank0",
                   **SWEEP}),
        "w4": (4, {"ops": list(COLLECTIVE_OPS), "algorithms": ALGOS, "ps_placement": "rank0",
                   **SWEEP}),
        "w4-dedicated": (4, {"ops": ["all_reduce"], "algorithms": ["builtin", "ps", "ring"],
                             "ps_placement": "dedicated", **SWEEP, "dtype": "bfloat16"}),
    }
    out = {}
    for name, (world, coll) in plan.items():
        run_dir, proc = launch(base / name, world, coll)
        assert proc.returncode == 0, f"{name}: {proc.stderr[-4000:]}"
        out[name] = (world, coll, run_dir, proc.stdout)
    return out


@pytest.mark.parametrize("name", ["w2", "w4", "w4-dedicated"])
def test_summary_verified_with_busbw(runs, name):
    world, coll, run_dir, stdout = runs[name]
    s = json.loads((run_dir / "summary.json").read_text())
    assert (s["world_size"], s["backend"]) == (world, "gloo")
    assert s["dtype"] == coll.get("dtype", "float32")
    assert s["all_correct"] is True and s["wrong"] == 0
    assert s["copy_bandwidth_GBps"] > 0 and s["d2d_copy_bandwidth_GBps"] is None
    assert s["sizes"] == [3072, 196608]
    want = {(op, a) for op in coll["ops"]
            for a in (coll["algorithms"] if op == "all_reduce" else ["builtin"])}
    assert {(r["op"], r["algorithm"]) for r in s["results"]} == want
    assert len(s["results"]) == 2 * len(want)
    for r in s["results"]:
        assert r["correct"] is True, r
        assert 0 < r["time_us_min"] <= r["time_us_mean"] <= r["time_us_max"]
        n = world - 1 if (r["algorithm"], r["ps_placement"]) == ("ps", "dedicated") else world
        assert r["n"] == n
        assert r["algbw_GBps"] == pytest.approx(r["bytes"] / (r["time_us_mean"] * 1e-6) / 1e9)
        assert r["busbw_GBps"] == pytest.approx(
            r["algbw_GBps"] * float(commbytes.busbw_factor(r["op"], n)))
        assert r["busbw_frac_of_copy"] == pytest.approx(
            r["busbw_GBps"] / s["copy_bandwidth_GBps"])
    # the run's log: one nccl-tests-like line per point
    assert "busbw(GB/s)" in stdout and stdout.count(" ok") >= len(s["results"])
    assert not list(run_dir.glob("error-rank*.txt"))


@pytest.mark.parametrize(("name", "algorithm"), [
    ("w2", "naive"), ("w2", "ps"), ("w2", "ring"), ("w2", "tree"), ("w2", "butterfly"),
    ("w4", "naive"), ("w4", "ps"), ("w4", "ring"), ("w4", "tree"), ("w4", "butterfly"),
    ("w4-dedicated", "ps"), ("w4-dedicated", "ring"),
])
def test_seed_000_table_from_traces(runs, name, algorithm):
    world, coll, run_dir, _ = runs[name]
    traces = load_traces(run_dir)
    assert sorted(traces) == list(range(world))
    steps = point_steps(traces, "all_reduce", algorithm)
    assert len(steps) == 2
    for M, step in steps.items():
        recs = p2p_records(traces, step)
        assert_seed_table(recs, algorithm, world, M, coll["ps_placement"])


def test_builtin_collectives_traced_once_per_point(runs):
    world, coll, run_dir, _ = runs["w4"]
    traces = load_traces(run_dir)
    for op in coll["ops"]:
        for M, step in point_steps(traces, op, "builtin").items():
            for recs in traces.values():
                comm = [r for r in recs if r["type"] == "comm" and r["step"] == step]
                if op == "send_recv":
                    assert sorted(r["op"] for r in comm) == ["recv", "send"]
                else:
                    assert [(r["op"], r["payload_bytes"], r["group_size"]) for r in comm] \
                        == [(op, M, world)]


def test_failure_writes_error_file(tmp_path, monkeypatch):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"kind": "train", "runtime": {"nproc_per_node": 1}}))
    monkeypatch.setenv("RANK", "3")
    with pytest.raises(ValueError, match="collective_bench"):
        bench_main(["--spec", str(spec), "--out", str(tmp_path / "out")])
    text = (tmp_path / "out" / "error-rank3.txt").read_text()
    assert text.startswith("rank 3: ValueError") and "Traceback" in text
