"""HTA's figures on small hand-drawn kernel timelines, worked out by hand below."""

from __future__ import annotations

import pytest

from jobs.kineto.breakdown import kernel_type_time, overlap_pct, temporal_breakdown
from jobs.kineto.records import kernel_type

NCCL = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"
GEMM = "ampere_sgemm_128x64_nn"
COPY = "Memcpy HtoD (Pageable -> Device)"


def k(name: str, ts: float, end: float) -> dict:
    return {"name": name, "ts": ts, "end": end, "kernel_type": kernel_type(name)}


def test_kernel_type_rule():
    assert kernel_type(NCCL) == "COMMUNICATION"
    assert kernel_type(COPY) == "MEMORY"
    assert kernel_type("Memset (Device)") == "MEMORY"
    assert kernel_type(GEMM) == "COMPUTATION"
    assert kernel_type("Stream Sync") == "OTHER"
    assert kernel_type("gloo_allreduce") == "COMPUTATION"  # HTA: only nccl*Kernel is comm


# Two NCCL kernels on two streams overlap each other (0-40 and 20-60: merged 0-60);
# compute runs 30-50 and 90-100; a copy runs 55-70. Window 0-100.
TIMELINE = [k(NCCL, 0, 40), k(NCCL, 20, 60), k(GEMM, 30, 50), k(GEMM, 90, 100), k(COPY, 55, 70)]


def test_temporal_by_hand():
    got = temporal_breakdown(TIMELINE)
    # busy: 0-70 and 90-100 = 80 of 100 -> idle 20; compute 20 + 10 = 30; rest 50
    assert got["kernel_time_us"] == 100
    assert (got["idle_time_us"], got["compute_time_us"], got["non_compute_time_us"]) == (20, 30, 50)
    assert (got["idle_pct"], got["compute_pct"], got["non_compute_pct"]) == (20.0, 30.0, 50.0)


def test_overlap_merges_communication_first():
    # merged comm 0-60 (60 us) meets compute on 30-50 (20 us): 33.33 %, not 40/80 = 50 %
    # (unmerged comm counts 30-40 twice) nor 20/40.
    assert overlap_pct(TIMELINE) == pytest.approx(100 * 20 / 60)
    assert overlap_pct([k(GEMM, 0, 10)]) is None
    # compute on two streams (10-50, 30-70) merges to 10-70: 60 of 100 us, not 80
    two_streams = [k(NCCL, 0, 100), k(GEMM, 10, 50), k(GEMM, 30, 70)]
    assert overlap_pct(two_streams) == pytest.approx(60.0)


def test_kernel_types_by_hand():
    got = kernel_type_time(TIMELINE, include_memory=True)
    assert got == {
        "COMMUNICATION": 30 + 5,  # 0-30, 50-55
        "COMPUTATION overlapping COMMUNICATION": 20,  # 30-50
        "COMMUNICATION overlapping MEMORY": 5,  # 55-60
        "MEMORY": 10,  # 60-70
        "COMPUTATION": 10,  # 90-100
    }
    without = kernel_type_time(TIMELINE, include_memory=False)
    assert without == {"COMMUNICATION": 40, "COMPUTATION overlapping COMMUNICATION": 20,
                       "COMPUTATION": 10}


def test_kernel_types_truncate_each_stretch():
    # HTA casts each stretch to int: 0-1.5 compute alone -> 1; 1.5-3.75 both -> 2;
    # 3.75-4 comm alone -> 0
    got = kernel_type_time([k(GEMM, 0, 3.75), k(NCCL, 1.5, 4)], include_memory=False)
    assert got == {"COMPUTATION": 1, "COMPUTATION overlapping COMMUNICATION": 2,
                   "COMMUNICATION": 0}
