"""A Kineto rank trace (records.RankTrace) -> paralab trace records (docs/trace-schema.md), so an
imported run goes through the same analysis engine, tables, Gantt and exports as a launched one.

The mapping (stated in docs/trace-schema.md, "Imported Kineto traces"):

- ``ProfilerStep#N`` host spans -> ``span`` ``step`` (cat ``step``, step N) and a ``scalars``
  record per step (``step_s`` = the span's length).
- GPU kernels (HTA's kernel types, records.kernel_type):
  COMPUTATION -> ``span`` cat ``compute`` named after the kernel, with ``stream`` / ``device``;
  MEMORY (memcpy / memset) -> ``span`` cat ``gpu_memory``; OTHER -> cat ``gpu_other``;
  COMMUNICATION -> a ``comm`` record: op, dtype and sizes from the profiler's collective
  arguments (the ``record_param_comms`` span that launched the kernel, found by the launch's
  correlation id) or, where the profiler recorded none, the op from the kernel's name and no
  bytes. A kernel's step is the step whose host span holds its launch (the CPU runs ahead of
  the GPU: a kernel may run after its step's host span ended); a kernel whose launch is not in
  the trace takes the step its own start falls in.
- CPU-only traces (no GPU activity, e.g. gloo): the top-level ``cpu_op`` spans of a thread
  stand for its compute, and ``gloo:<op>`` spans are the ``comm`` records (sizes from the
  recorded input shapes).
- The profiler's memory events (``profile_memory=True``; CUDA's alone when there are any):
  per step and device one ``mem``
  record (phase ``step_peak``) at the moment the allocator's total was highest in the step,
  ``allocator`` = that total (every tensor of the device, not split into components),
  ``allocator_reserved`` = the reserved total then, ``device`` (``cpu``, ``cuda:N``).
Times: Kineto's microseconds -> integer ns (``ts * 1000``, plus ``baseTimeNanoseconds`` when the
file has one: its ``ts`` are then relative). ``seq`` numbers each process group's collectives
in this file's order, so rank r's q-th collective of a group meets rank s's q-th when the ranks
traced the same steps.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterator

from jobs import commbytes
from jobs.kineto.records import COMMUNICATION, COMPUTATION, MEMORY, RankTrace

NAME_MAX = 200  # kernel names are C++ signatures: the leading part names the kernel
# ncclKernel_AllReduce_RING_LL_Sum_float, ncclDevKernel_ReduceScatter_Sum_f32_RING_LL, ...
NCCL_OP_RE = re.compile(r"^nccl(?:Dev)?Kernel_([A-Za-z]+)")
OP_NAMES = {  # profiler / NCCL spellings -> paralab's op names (docs/trace-schema.md)
    "allreduce": "all_reduce", "all_reduce": "all_reduce", "reducescatter": "reduce_scatter",
    "reduce_scatter": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter", "allgather": "all_gather",
    "all_gather": "all_gather", "_allgather_base": "all_gather",
    "allgather_into_tensor_coalesced": "all_gather", "all_gather_into_tensor": "all_gather",
    "broadcast": "broadcast", "reduce": "reduce", "alltoall": "all_to_all",
    "all_to_all": "all_to_all", "alltoall_base": "all_to_all", "all_to_allv": "all_to_all",
    "sendrecv": "send_recv", "send": "send", "recv": "recv", "recv_anysource": "recv",
    "gather": "gather", "scatter": "scatter", "barrier": "barrier",
}
DTYPE_BYTES = {
    "float": 4, "float32": 4, "int": 4, "int32": 4, "double": 8, "float64": 8, "long": 8,
    "int64": 8, "half": 2, "float16": 2, "bfloat16": 2, "short": 2, "int16": 2, "char": 1,
    "byte": 1, "int8": 1, "uint8": 1, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
}


def op_name(raw: str | None) -> str | None:
    """A collective's paralab name from the profiler's 'Collective name' or an NCCL kernel's."""
    if not raw:
        return None
    key = raw.strip().lower().removeprefix("nccl:").removeprefix("gloo:")
    return OP_NAMES.get(key, OP_NAMES.get(key.replace("_", "")))


def kernel_op(name: str) -> str | None:
    m = NCCL_OP_RE.match(name)
    return op_name(m.group(1)) if m else None


def payload_bytes(op: str | None, in_n, out_n, dtype: str | None) -> int | None:
    """S in the nccl-tests convention (trace-schema `payload_bytes`): all-gather the gathered
    output, reduce-scatter the unsharded input, all-to-all the send buffer, else the array."""
    size = DTYPE_BYTES.get(str(dtype or "").lower().removeprefix("c10::"))
    if size is None or op is None:
        return None
    ns = [n for n in (in_n, out_n) if isinstance(n, int | float) and n >= 0]
    if not ns:
        return None
    n = in_n if op == "all_to_all" and isinstance(in_n, int | float) else max(ns)
    return int(n) * size


class _Steps:
    """Which ProfilerStep#N holds a host time."""

    def __init__(self, steps: list[dict]):
        self.rows = sorted(steps, key=lambda s: s["ts"])
        self.starts = [s["ts"] for s in self.rows]

    def at(self, ts) -> int:
        i = bisect.bisect_right(self.starts, ts) - 1
        if i < 0:
            return -1
        s = self.rows[i]
        # after the last step's end nothing is that step's but the GPU's lag (kernels go by launch)
        return s["step"] if ts <= s["end"] or i + 1 < len(self.rows) else -1


class _Comms:
    """The record_param_comms span around a kernel launch (same thread, innermost)."""

    def __init__(self, rt: RankTrace):
        self.by_tid: dict = {}
        for c in rt.collectives:
            self.by_tid.setdefault(c["tid"], []).append(c)
        for rows in self.by_tid.values():
            rows.sort(key=lambda c: c["ts"])
        self.launch = {r["correlation"]: r for r in rt.runtime if r["correlation"] >= 0}

    def of_kernel(self, k: dict) -> tuple[dict | None, dict | None]:
        launch = self.launch.get(k["correlation"])
        if launch is None:
            return None, None
        rows = self.by_tid.get(launch["tid"], [])
        i = bisect.bisect_right([c["ts"] for c in rows], launch["ts"]) - 1
        while i >= 0:
            c = rows[i]
            if c["ts"] + (c["dur"] or 0) >= launch["ts"]:
                return c, launch
            i -= 1
        return None, launch


def _ns(ts, base: int) -> int:
    return base + int(round(float(ts) * 1000))


def records(rt: RankTrace, world_size: int) -> Iterator[dict]:
    """Every paralab record of one rank, meta first (see the module docstring)."""
    base = int(rt.meta.get("baseTimeNanoseconds") or 0)
    steps = _Steps(rt.steps)
    info = rt.distributed_info
    starts = [x["ts"] for x in (*rt.kernels, *rt.cpu_ops)]
    t0 = _ns(min(starts), base) if starts else base
    common = {"rank": rt.rank, "microbatch": None}
    yield {"type": "meta", **common, "step": -1, "schema": 2, "world_size": world_size,
           "coords": {"dp": rt.rank, "tp": 0, "pp": 0}, "pid": None, "t0_ns": t0,
           "clock": "kineto", "clock_offset_ns": 0, "clock_error_ns": 0,
           "backend": info.get("backend"), "source": "kineto", "strategy": "import",
           "pg_config": info.get("pg_config")}
    for s in rt.steps:
        ts, dur = _ns(s["ts"], base), int(round(float(s["dur"]) * 1000))
        yield {"type": "span", **common, "step": s["step"], "name": "step", "cat": "step",
               "ts_ns": ts, "dur_ns": dur}
        yield {"type": "scalars", **common, "step": s["step"], "ts_ns": ts + dur,
               "traced": True, "step_s": dur / 1e9}
    seqs: dict[str, int] = {}
    last = t0
    for rec in (_gpu if rt.kernels else _cpu)(rt, world_size, base, steps, seqs, common):
        last = max(last, rec["ts_ns"] + rec.get("dur_ns", 0))
        yield rec
    yield from _memory(rt, base, steps, common)
    ends = [_ns(s["end"], base) for s in rt.steps]
    # the profiler wrote the file whole: every collective it holds completed
    yield {"type": "end", **common, "step": rt.steps[-1]["step"] if rt.steps else -1,
           "ts_ns": max([last, *ends]), "reason": "ok", "issued": dict(seqs),
           "last_completed_seq": {g: n - 1 for g, n in seqs.items()}}


def _comm(row: dict | None, op: str | None, world_size: int, seqs: dict, **fields) -> dict:
    row = row or {}
    pg = row.get("pg_name")
    group = f"pg:{pg}" if pg is not None else "pg:unknown"
    n = int(row.get("group_size") or 0) or None
    s = payload_bytes(op, row.get("in_nelems"), row.get("out_nelems"), row.get("dtype"))
    seq = seqs.get(group, 0)
    seqs[group] = seq + 1
    rec = {"type": "comm", "op": op or "unknown", "axis": "dp" if n == world_size else group,
           "group": group, "seq": seq, "group_size": n, "payload_bytes": s,
           "dtype": row.get("dtype"), "async": True, **fields}
    if s is not None and n:
        try:
            rec["bytes_sent"] = commbytes.bytes_sent(op, s, n)
            rec["bytes_recv"] = commbytes.bytes_recv(op, s, n)
        except ValueError:  # an op commbytes has no factors for: its bytes stay unknown
            rec.pop("bytes_sent", None)
    if row.get("group_ranks"):
        rec["group_ranks"] = row["group_ranks"]
    return rec


def _gpu(rt, world_size, base, steps, seqs, common) -> Iterator[dict]:
    comms = _Comms(rt)
    for k in sorted(rt.kernels, key=lambda k: k["ts"]):
        row, launch = comms.of_kernel(k)
        step = steps.at(launch["ts"] if launch is not None else k["ts"])
        where = {**common, "step": step, "ts_ns": _ns(k["ts"], base),
                 "dur_ns": int(round(float(k["dur"]) * 1000)), "stream": k["stream"],
                 "device": k["device"]}
        if k["kernel_type"] == COMMUNICATION:
            op = op_name(row.get("collective")) if row else None
            yield _comm(row, op or kernel_op(k["name"]), world_size, seqs, **where,
                        name=k["name"][:NAME_MAX])
        else:
            cat = {COMPUTATION: "compute", MEMORY: "gpu_memory"}.get(k["kernel_type"],
                                                                     "gpu_other")
            yield {"type": "span", **where, "name": k["name"][:NAME_MAX], "cat": cat}


def _cpu(rt, world_size, base, steps, seqs, common) -> Iterator[dict]:
    gloo = {(c["tid"], c["ts"]) for c in rt.collectives if c["source"] == "gloo_span"}
    ends: dict = {}  # tid -> end of the current top-level op
    for op in sorted(rt.cpu_ops, key=lambda o: (o["ts"], -float(o["dur"]))):
        if op["cat"] != "cpu_op" or op["ts"] < ends.get(op["tid"], float("-inf")):
            continue  # nested in an op already taken (or not an op)
        ends[op["tid"]] = op["ts"] + float(op["dur"])
        where = {**common, "step": steps.at(op["ts"]), "ts_ns": _ns(op["ts"], base),
                 "dur_ns": int(round(float(op["dur"]) * 1000))}
        if (op["tid"], op["ts"]) not in gloo:
            yield {"type": "span", **where, "name": op["name"][:NAME_MAX], "cat": "compute"}
    for c in sorted((c for c in rt.collectives if c["source"] == "gloo_span"),
                    key=lambda c: c["ts"]):
        op = op_name(c["collective"])
        row = {**c, "group_size": c["group_size"] or world_size}
        yield _comm(row, op, world_size, seqs, **common, step=steps.at(c["ts"]),
                    ts_ns=_ns(c["ts"], base), dur_ns=int(round(float(c["dur"]) * 1000)),
                    name=f"gloo:{c['collective']}")


def _memory(rt, base, steps, common) -> Iterator[dict]:
    peaks: dict = {}  # (step, device) -> the event with the highest total
    # a GPU job's memory is its device's: host allocations are left out when CUDA's are there
    cuda = any(m["device_type"] == 1 for m in rt.memory)
    for m in (m for m in rt.memory if m["device_type"] == 1 or not cuda):
        kind = {0: "cpu", 1: "cuda"}.get(m["device_type"], f"device{m['device_type']}")
        dev = kind if kind == "cpu" else f"{kind}:{max(m['device_id'], 0)}"
        key = (steps.at(m["ts"]), dev)
        if key not in peaks or m["total_allocated"] > peaks[key]["total_allocated"]:
            peaks[key] = m
    for (step, dev), m in sorted(peaks.items(), key=lambda kv: kv[1]["ts"]):
        yield {"type": "mem", **common, "step": step, "phase": "step_peak",
               "ts_ns": _ns(m["ts"], base), "device": dev, "allocator": m["total_allocated"],
               "allocator_reserved": m["total_reserved"]}
