"""HTA's figures on public multi-GPU Kineto traces, recorded by hta_expected.py, against
ours. Runs without HTA installed; test_hta_live.py re-derives the numbers from HTA."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from jobs.kineto.breakdown import (
    hta_kernels,
    kernel_type_breakdown,
    overlap_pct,
    temporal_breakdown,
    top_kernels,
)
from jobs.kineto.records import load_ranks

HERE = Path(__file__).resolve().parent
DATA = HERE.parents[0] / "data" / "kineto"
EXPECTED = json.loads((HERE / "hta_expected.json").read_text())["sets"]
PCT_TOL = 0.1  # percentage points, the acceptance bound


@pytest.fixture(scope="module", params=sorted(EXPECTED))
def trace_set(request):
    name = request.param
    ranks = load_ranks(sorted((DATA / name).glob("rank-*.json.gz")))
    return name, hta_kernels(ranks), EXPECTED[name]


def test_every_set_is_multi_gpu_nccl(trace_set):
    name, per_rank, _ = trace_set
    ranks = load_ranks(sorted((DATA / name).glob("rank-*.json.gz")))
    for rt in ranks.values():
        assert rt.distributed_info["backend"] == "nccl"
        assert rt.world_size >= 2
        assert any(k["kernel_type"] == "COMMUNICATION" for k in rt.kernels)


def test_temporal_breakdown_matches_hta(trace_set):
    _, per_rank, exp = trace_set
    assert sorted(per_rank) == sorted(int(r) for r in exp["temporal"])
    for rank, want in exp["temporal"].items():
        got = temporal_breakdown(per_rank[int(rank)])
        for key in ("idle_pct", "compute_pct", "non_compute_pct"):
            assert abs(got[key] - want[key]) < PCT_TOL, (rank, key, got[key], want[key])
            assert abs(got[key] - want["hta_" + key.replace("_pct", "_time_pctg")]) < PCT_TOL
        for key in ("kernel_time_us", "idle_time_us", "compute_time_us", "non_compute_time_us"):
            assert got[key] == pytest.approx(want[key], abs=1e-3), (rank, key)


def test_overlap_matches_hta(trace_set):
    _, per_rank, exp = trace_set
    for rank, want in exp["overlap_pct"].items():
        got = overlap_pct(per_rank[int(rank)])
        assert got is not None and abs(got - want) < PCT_TOL, (rank, got, want)


@pytest.mark.parametrize("include_memory", [False, True])
def test_kernel_type_breakdown_equals_hta(trace_set, include_memory):
    _, per_rank, exp = trace_set
    want = exp["kernel_types"]["with_memory" if include_memory else "without_memory"]
    got = {r["kernel_type"]: r["sum_us"] for r in kernel_type_breakdown(per_rank, include_memory)}
    assert got == want


def test_top_kernels_match_hta(trace_set):
    _, per_rank, exp = trace_set
    ours = defaultdict(dict)
    for rank, kernels in per_rank.items():
        for row in top_kernels(kernels, n=None):
            ours[(rank, row["kernel_type"])][row["name"]] = row["sum_us"]
    assert exp["top_kernels"]
    for want in exp["top_kernels"]:
        got = ours[(want["rank"], want["kernel_type"])][want["name"]]
        assert got == pytest.approx(want["sum_us"], abs=1e-3), want
    # HTA's largest kernel per rank and type is our largest too
    for (rank, kt), sums in ours.items():
        hta_names = [w for w in exp["top_kernels"] if (w["rank"], w["kernel_type"]) == (rank, kt)]
        if hta_names and kt != "MEMORY":
            best = max(hta_names, key=lambda w: w["sum_us"])
            assert max(sums, key=sums.get) == best["name"]
