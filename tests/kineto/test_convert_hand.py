"""Kineto events -> paralab records (jobs/kineto/convert.py) on a hand-drawn GPU trace, every
expected value worked out by hand from the events below."""

from __future__ import annotations

import json

from jobs.kineto.convert import records
from jobs.kineto.records import load_rank

# Host: ProfilerStep#7 0-100 us, #8 100-200. In step 7 the CPU launches (correlation ids):
# a GEMM (c=1) at 10, an all_gather (c=2) inside record_param_comms 20-30 (4 -> 8 Float,
# group of 2, pg "0"), a reduce_scatter (c=3) inside record_param_comms 40-50 (8 -> 4 Float)
# and a memcpy (c=4) at 60. The GPU lags: the GEMM runs 90-150 (past step 7's host end), the
# all_gather 150-160, the reduce_scatter 160-175 on stream 20, the copy 175-180.
# Step 8 launches one GEMM (c=5) at 110 that runs 180-190. The base time shifts every ts.
BASE = 1_000_000_000


def ev(name, cat, ts, dur, tid=1, **args):
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 1, "tid": tid,
            "args": args}


EVENTS = [
    ev("ProfilerStep#7", "user_annotation", 0, 100),
    ev("ProfilerStep#8", "user_annotation", 100, 100),
    ev("cudaLaunchKernel", "cuda_runtime", 10, 2, correlation=1),
    ev("record_param_comms", "cpu_op", 20, 10, **{
        "Collective name": "allgather", "In msg nelems": 4, "Out msg nelems": 8,
        "dtype": "Float", "Group size": 2, "Process Group Name": "0",
        "Process Group Ranks": "[0, 1]"}),
    ev("cudaLaunchKernel", "cuda_runtime", 25, 2, correlation=2),
    ev("record_param_comms", "cpu_op", 40, 10, **{
        "Collective name": "_reduce_scatter_base", "In msg nelems": 8, "Out msg nelems": 4,
        "dtype": "Float", "Group size": 2, "Process Group Name": "0"}),
    ev("cudaLaunchKernel", "cuda_runtime", 45, 2, correlation=3),
    ev("cudaMemcpyAsync", "cuda_runtime", 60, 2, correlation=4),
    ev("cudaLaunchKernel", "cuda_runtime", 110, 2, correlation=5),
    ev("ampere_sgemm_128x64_nn", "kernel", 90, 60, tid=7, device=0, stream=7, correlation=1),
    ev("ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclDevComm*)", "kernel", 150, 10, tid=20,
       device=0, stream=20, correlation=2),
    ev("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", "kernel", 160, 15, tid=20, device=0,
       stream=20, correlation=3),
    ev("Memcpy HtoD (Pageable -> Device)", "gpu_memcpy", 175, 5, tid=7, device=0, stream=7,
       correlation=4),
    ev("ampere_sgemm_128x64_nn", "kernel", 180, 10, tid=7, device=0, stream=7, correlation=5),
]


def test_a_hand_drawn_gpu_trace(tmp_path):
    p = tmp_path / "rank-1.json"
    p.write_text(json.dumps({"schemaVersion": 1, "baseTimeNanoseconds": BASE,
                             "distributedInfo": {"backend": "nccl", "rank": 1, "world_size": 2},
                             "traceEvents": EVENTS}))
    recs = list(records(load_rank(p), 2))
    meta = recs[0]
    assert meta["type"] == "meta" and meta["rank"] == 1 and meta["world_size"] == 2
    assert meta["t0_ns"] == BASE  # the first event, ProfilerStep#7 at 0
    steps = [(r["step"], r["ts_ns"], r["dur_ns"]) for r in recs if r.get("cat") == "step"]
    assert steps == [(7, BASE, 100_000), (8, BASE + 100_000, 100_000)]
    spans = [(r["cat"], r["step"], r["ts_ns"] - BASE, r["dur_ns"], r["stream"])
             for r in recs if r["type"] == "span" and r["cat"] != "step"]
    # the first GEMM runs mostly after step 7's host span, but was launched in it: step 7
    assert spans == [("compute", 7, 90_000, 60_000, 7), ("gpu_memory", 7, 175_000, 5_000, 7),
                     ("compute", 8, 180_000, 10_000, 7)]
    comms = [r for r in recs if r["type"] == "comm"]
    assert [(c["op"], c["step"], c["seq"], c["group"], c["group_size"]) for c in comms] == [
        ("all_gather", 7, 0, "pg:0", 2), ("reduce_scatter", 7, 1, "pg:0", 2)]
    # S (nccl-tests): all-gather's gathered output, reduce-scatter's unsharded input: 8 x 4 B;
    # each rank sends and receives (N-1)/N of it
    assert [(c["payload_bytes"], c["bytes_sent"], c["bytes_recv"]) for c in comms] == [
        (32, 16.0, 16.0), (32, 16.0, 16.0)]
    assert comms[0]["group_ranks"] == [0, 1] and comms[0]["axis"] == "dp"
    assert (comms[1]["ts_ns"] - BASE, comms[1]["dur_ns"]) == (160_000, 15_000)


def test_without_collective_arguments_the_kernel_names_the_op(tmp_path):
    events = [ev("ProfilerStep#0", "user_annotation", 0, 100),
              ev("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)", "kernel", 5, 10,
                 device=0, stream=21, correlation=9)]
    p = tmp_path / "r.json"
    p.write_text(json.dumps({"distributedInfo": {"rank": 0, "world_size": 4},
                             "traceEvents": events}))
    (c,) = [r for r in records(load_rank(p), 4) if r["type"] == "comm"]
    # no launch in the trace: the kernel's own start places it; no sizes: no bytes
    assert (c["op"], c["step"], c["payload_bytes"], c["group"]) == \
        ("send_recv", 0, None, "pg:unknown")
    assert "bytes_sent" not in c


def test_launch_delays_by_hand(tmp_path):
    from jobs.kineto.launches import launch_summary
    p = tmp_path / "rank-1.json"
    p.write_text(json.dumps({"distributedInfo": {"rank": 1, "world_size": 2},
                             "traceEvents": EVENTS}))
    # kernel start - launch end: GEMM 90-12, all_gather 150-27, reduce_scatter 160-47,
    # memcpy 175-62, GEMM 180-112 = 78, 123, 113, 113, 68
    got = launch_summary(load_rank(p))
    assert got == {"rank": 1, "launches": 5, "launch_delay_median_us": 113.0,
                   "launch_delay_p95_us": 123.0, "launch_delay_max_us": 123.0,
                   "cpu_duration_mean_us": 2.0, "short_kernels": 0}
