"""Rows from a public NCCL trace against the file read with the standard json module."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from jobs.kineto.records import load_rank, to_table

NCCL = Path(__file__).resolve().parents[1] / "data" / "kineto" / "nccl_2gpu" / "rank-0.json.gz"


def test_collectives_kernels_steps_match_raw_json():
    raw = json.loads(gzip.decompress(NCCL.read_bytes()))
    events = raw["traceEvents"]
    rt = load_rank(NCCL)
    assert (rt.rank, rt.world_size) == (0, 2)

    comms = [e for e in events if e.get("name") == "record_param_comms"]
    assert len(rt.collectives) == len(comms) > 0
    ours = sorted(rt.collectives, key=lambda r: r["ts"])
    for row, ev in zip(ours, sorted(comms, key=lambda e: e["ts"]), strict=True):
        a = ev["args"]
        assert row["collective"] == a.get("Collective name")
        assert row["in_nelems"] == a.get("In msg nelems")
        assert row["out_nelems"] == a.get("Out msg nelems")
        assert row["dtype"] == a.get("dtype")
        assert row["group_size"] == a.get("Group size")
    allreduce = [r for r in rt.collectives if r["collective"] == "allreduce"]
    assert allreduce and all(r["group_ranks"] == [0, 1] and r["pg_desc"] == "default_pg"
                             for r in allreduce)

    def n(cat):
        return sum(1 for e in events if e.get("cat") == cat)

    assert len(rt.kernels) == n("kernel") + n("gpu_memcpy") + n("gpu_memset")
    assert len(rt.runtime) == n("cuda_runtime") + n("cuda_driver")
    by_cat = {c: [k for k in rt.kernels if k["cat"] == c] for c in ("gpu_memcpy", "gpu_memset")}
    assert all(k["kernel_type"] == "MEMORY" for rows in by_cat.values() for k in rows)
    nccl = [k for k in rt.kernels if k["name"].startswith("ncclKernel")]
    assert nccl and all(k["kernel_type"] == "COMMUNICATION" for k in nccl)
    host_steps = sorted(int(e["name"].split("#")[1]) for e in events
                        if e.get("name", "").startswith("ProfilerStep#")
                        and e.get("cat") in ("cpu_op", "user_annotation"))
    assert [s["step"] for s in rt.steps] == host_steps == [4, 5, 6]
    table = to_table(rt.kernels)
    assert table.num_rows == len(rt.kernels) and "kernel_type" in table.column_names
