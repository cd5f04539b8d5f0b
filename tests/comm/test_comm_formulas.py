"""nccl-tests bandwidth formulas against hand-computed numbers, and the sweep's pure helpers."""

from __future__ import annotations

import pytest
import torch

from jobs import commbytes
from jobs.comm import allreduce, sweep

GB = 1e9


@pytest.mark.parametrize(("op", "n", "busbw"), [
    # S = 1 GB moved in a mean time of 1 s: algbw = 1 GB/s; busbw = factor.
    ("all_reduce", 2, 1.0),      # 2(n-1)/n = 2*1/2
    ("all_reduce", 4, 1.5),      # 2*3/4
    ("all_reduce", 8, 1.75),     # 2*7/8
    ("reduce_scatter", 4, 0.75),  # (n-1)/n
    ("all_gather", 4, 0.75),
    ("all_to_all", 4, 0.75),
    ("reduce_scatter", 2, 0.5),
    ("broadcast", 4, 1.0),
    ("reduce", 4, 1.0),
    ("send_recv", 2, 1.0),
])
def test_busbw_hand_computed(op, n, busbw):
    # times over ranks and iterations: mean 1.0 s, min 0.5 s, max 1.5 s
    row = sweep.summarize(op, 10**9, n, [0.5, 1.5, 1.0, 1.0], copy_Bps=4 * GB)
    assert row["time_us_min"] == pytest.approx(0.5e6)
    assert row["time_us_mean"] == pytest.approx(1.0e6)
    assert row["time_us_max"] == pytest.approx(1.5e6)
    assert row["algbw_GBps"] == pytest.approx(1.0)
    assert row["busbw_GBps"] == pytest.approx(busbw)
    assert row["busbw_frac_of_copy"] == pytest.approx(busbw / 4)


def test_busbw_small_numbers():
    # 16 MiB all-reduce on 2 ranks in 20 ms: algbw = 16777216 / 0.02 = 838.8608 MB/s = busbw.
    row = sweep.summarize("all_reduce", 16 << 20, 2, [0.02])
    assert row["algbw_GBps"] == pytest.approx(0.8388608)
    assert row["busbw_GBps"] == pytest.approx(0.8388608)
    # 1 MiB all-gather on 4 ranks in 1 ms: algbw 1.048576 GB/s, busbw * 3/4 = 0.786432.
    row = sweep.summarize("all_gather", 1 << 20, 4, [0.001])
    assert row["algbw_GBps"] == pytest.approx(1.048576)
    assert row["busbw_GBps"] == pytest.approx(0.786432)
    assert row["busbw_frac_of_copy"] is None
    # the factors come from jobs.commbytes, nowhere else
    assert commbytes.busbw_factor("all_reduce", 4) == pytest.approx(1.5)


def test_sweep_sizes_like_nccl_tests():
    assert sweep.sweep_sizes(8, 128, 2) == [8, 16, 32, 64, 128]
    assert sweep.sweep_sizes(1024, 1 << 20, 32) == [1024, 32768, 1 << 20]
    assert sweep.sweep_sizes(100, 1000, 4) == [100, 400]  # never past max
    assert sweep.sweep_sizes(64, 64, 2) == [64]
    with pytest.raises(ValueError):
        sweep.sweep_sizes(128, 64, 2)


def test_element_count_rounds_sharded_ops():
    assert sweep.element_count("all_reduce", 10, 4, 4) == 2
    assert sweep.element_count("all_reduce", 2, 4, 4) == 1  # at least one element
    assert sweep.element_count("reduce_scatter", 1000, 4, 3) == 249  # multiple of n
    assert sweep.element_count("all_gather", 4, 4, 4) == 4  # at least n
    assert sweep.element_count("all_to_all", 64, 2, 4) == 32


@pytest.mark.parametrize("dtype", list(sweep.DTYPES.values()))
def test_pattern_sums_exactly(dtype):
    total = sweep.pattern_sum(range(4), 1000, dtype, "cpu")
    acc = sweep.pattern(0, 1000, dtype, "cpu")
    for r in range(1, 4):
        acc = acc + sweep.pattern(r, 1000, dtype, "cpu")
    assert torch.equal(acc, total)
    assert int(total.max()) <= 44


def test_value_span_keeps_sums_exact():
    assert sweep.value_span(torch.bfloat16, 4) == 11
    assert sweep.value_span(torch.bfloat16, 32) == 8  # 8 * 32 = 256
    assert sweep.value_span(torch.bfloat16, 1000) == 1
    assert sweep.value_span(torch.float16, 256) == 8
    assert sweep.value_span(torch.float32, 4096) == 11
    span = sweep.value_span(torch.bfloat16, 32)
    total = sweep.pattern_sum(range(32), 500, torch.bfloat16, "cpu", span)
    ref = sweep.pattern_sum(range(32), 500, torch.int64, "cpu", span)
    assert torch.equal(total.to(torch.int64), ref) and int(ref.max()) <= 256


def test_chunk_bounds_cover():
    assert allreduce.chunk_bounds(10, 4) == [(0, 2), (2, 5), (5, 7), (7, 10)]
    assert allreduce.chunk_bounds(2, 4) == [(0, 0), (0, 1), (1, 1), (1, 2)]


def test_points_order_and_algorithms_only_for_all_reduce():
    from jobs.collective_bench import points
    from jobs.spec import parse_spec

    spec = parse_spec({"kind": "collective_bench", "runtime": {"nproc_per_node": 4},
                       "collective": {"ops": ["broadcast", "all_reduce"],
                                      "algorithms": ["builtin", "ring"], "min_bytes": 64,
                                      "max_bytes": 256, "factor": 4}})
    assert points(spec) == [("broadcast", "builtin", 64), ("broadcast", "builtin", 256),
                            ("all_reduce", "builtin", 64), ("all_reduce", "builtin", 256),
                            ("all_reduce", "ring", 64), ("all_reduce", "ring", 256)]
    spec = parse_spec({"kind": "collective_bench",
                       "collective": {"ops": ["all_gather"], "algorithms": ["tree"]}})
    assert {a for _, a, _ in points(spec)} == {"builtin"}


def test_format_row():
    from jobs.collective_bench import HEADER, format_row

    row = {"op": "all_reduce", "algorithm": "ring", "bytes": 16777216, "count": 4194304,
           "dtype": "float32", "time_us_min": 20000.0, "time_us_mean": 21000.0,
           "time_us_max": 22000.0, "algbw_GBps": 0.799, "busbw_GBps": 0.799,
           "busbw_frac_of_copy": 0.0799, "correct": True}
    line = format_row(row)
    assert len(line) == len(HEADER)
    assert line.split() == ["16777216", "4194304", "float32", "all_reduce", "ring", "20000.0",
                            "21000.0", "22000.0", "0.799", "0.799", "8.0", "ok"]
    assert format_row({**row, "correct": False, "busbw_frac_of_copy": None}).split()[-2:] \
        == ["0.799", "FAIL"]


@pytest.mark.parametrize("op", ["all_reduce", "reduce_scatter", "all_gather", "all_to_all",
                                "reduce"])
@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_bytes_received_mirror_bytes_sent(op, n):
    """Conservation: over a group, what the ranks send is what the ranks receive. (Broadcast
    is the exception by convention: the root is charged S once, as nccl-tests does, while
    every other rank receives S, forwarded along a chain or tree.)"""
    from jobs.commbytes import bytes_recv, bytes_sent
    S = 1 << 20
    roots = [r == 0 for r in range(n)]
    sent = sum(bytes_sent(op, S, n, is_root=root) for root in roots)
    recv = sum(bytes_recv(op, S, n, is_root=root) for root in roots)
    assert sent == pytest.approx(recv) and sent > 0


def test_broadcast_receivers_get_the_array():
    from jobs.commbytes import bytes_recv
    assert bytes_recv("broadcast", 100, 4, is_root=False) == 100
    assert bytes_recv("broadcast", 100, 4, is_root=True) == 0
