"""Kineto trace events -> tidy per-rank rows (lists of dicts; ``to_table`` makes Arrow).

Tables of one :class:`RankTrace` (times in microseconds, as Kineto writes them):

- ``kernels``: GPU activities (``kernel``, ``gpu_memcpy``, ``gpu_memset``): name, cat, ts,
  dur, end, device, stream, correlation, ``kernel_type`` (HTA's classification, see RULES).
- ``runtime``: CUDA runtime / driver calls (``cudaLaunchKernel`` ...) with correlation.
- ``cpu_ops``: ``cpu_op`` / ``user_annotation`` / ``python_function`` spans on the host.
- ``steps``: host ``ProfilerStep#N`` spans -> step number, ts, dur.
- ``collectives``: ``record_param_comms`` spans with the profiler's collective args
  (collective name, in/out message element counts, dtype, group size/ranks, process
  group, sequence number) where the profiler recorded them (``source``
  'record_param_comms'), and ``gloo:<op>`` spans with their input shapes (``source``
  'gloo_span'; torch 2.13's CPU profiler writes no record_param_comms for gloo).
- ``memory``: the profiler's ``[memory]`` instant events (``profile_memory=True``): ts,
  device_type (0 CPU, 1 CUDA), device_id, total_allocated, total_reserved (the allocator's
  totals after that allocation or free), bytes (negative: a free).
- ``hta_rows``: the columns HTA's figures use (name, ts, dur, stream, correlation) after
  HTA's parser rules; see ``breakdown.py``.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from jobs.kineto.reader import KinetoTraceReader

# HTA (hta/utils/utils.py): the kernel-type regexes, copied verbatim.
NCCL_KERNEL_RE = re.compile(r"^nccl.*Kernel")
MEMORY_KERNEL_RE = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
NCCL_COMPUTE_KERNEL_RE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")

COMMUNICATION, COMPUTATION, MEMORY, OTHER = "COMMUNICATION", "COMPUTATION", "MEMORY", "OTHER"
GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
RUNTIME_CATS = frozenset({"cuda_runtime", "cuda_driver"})
CPU_CATS = frozenset({"cpu_op", "user_annotation", "python_function"})
# HTA (hta/common/trace_filter.py): device-level syncs run on the GPU although stream = -1.
DEVICE_SYNC_NAMES = frozenset({"Event Sync", "Context Sync"})
STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
# torch.profiler names a gloo collective's span "gloo:<op>" and records its input shapes.
GLOO_SPAN_RE = re.compile(r"^gloo:(\w+)$")

RULES = {
    "kernel_type": (
        "HTA get_kernel_type (hta/utils/utils.py): COMMUNICATION if the name matches "
        "^nccl.*Kernel; else MEMORY if it matches ^Memcpy|^Memset|^dma; else COMPUTATION "
        "unless it matches (^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync) (then OTHER)."
    ),
    "gpu_event": (
        "HTA (hta/common/trace_parser.py, trace.py): an event is a GPU event when its "
        "args.stream is an integer != -1; events without dur or cat, and cat 'Trace', are "
        "dropped; args.correlation defaults to -1."
    ),
    "ns_rounding": (
        "HTA round_down_time_stamps: when the file's ts are floats (ns-resolution "
        "traces), ts := ceil(ts) and end := floor(ts + dur) for every event."
    ),
}


def kernel_type(name: str) -> str:
    """HTA's ``get_kernel_type`` (rule text in RULES['kernel_type'])."""
    if NCCL_KERNEL_RE.match(name):
        return COMMUNICATION
    if MEMORY_KERNEL_RE.match(name):
        return MEMORY
    if not NCCL_COMPUTE_KERNEL_RE.match(name):
        return COMPUTATION
    return OTHER


def _int_or(value: Any, default: int) -> int:
    # HTA normalises args.stream with int(); non-numbers become the default.
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _ranks(value: Any) -> list[int] | None:
    if isinstance(value, list):
        return [int(v) for v in value]
    if isinstance(value, str) and value.strip().startswith("["):
        try:
            return [int(v) for v in json.loads(value)]
        except (ValueError, TypeError):
            return None
    return None


@dataclass
class RankTrace:
    path: str
    meta: dict[str, Any]
    rank: int
    world_size: int | None
    kernels: list[dict] = field(default_factory=list)
    runtime: list[dict] = field(default_factory=list)
    cpu_ops: list[dict] = field(default_factory=list)
    steps: list[dict] = field(default_factory=list)
    collectives: list[dict] = field(default_factory=list)
    memory: list[dict] = field(default_factory=list)
    hta_rows: list[dict] = field(default_factory=list)

    @property
    def distributed_info(self) -> dict[str, Any]:
        return dict(self.meta.get("distributedInfo") or {})


def _gloo_row(ev: dict, args: dict, op: str) -> dict:
    dims = args.get("Input Dims") or []
    types = args.get("Input type") or []
    nelems = sum(math.prod(d) for d in dims if isinstance(d, list)) if dims else None
    return {
        "source": "gloo_span", "ts": ev.get("ts"), "dur": ev.get("dur"), "tid": ev.get("tid"),
        "collective": op, "in_nelems": nelems, "out_nelems": None,
        "dtype": types[0] if types else None, "group_size": None, "group_ranks": None,
        "pg_name": None, "pg_desc": None, "seq": None, "in_split": None, "out_split": None,
    }


def _collective_row(ev: dict, args: dict) -> dict:
    return {
        "source": "record_param_comms",
        "ts": ev.get("ts"),
        "dur": ev.get("dur"),
        "tid": ev.get("tid"),
        "collective": args.get("Collective name"),
        "in_nelems": args.get("In msg nelems"),
        "out_nelems": args.get("Out msg nelems"),
        "dtype": args.get("dtype"),
        "group_size": args.get("Group size"),
        "group_ranks": _ranks(args.get("Process Group Ranks")),
        "pg_name": args.get("Process Group Name"),
        "pg_desc": args.get("Process Group Description"),
        "seq": args.get("Seq", args.get("seq")),
        "in_split": _ranks(args.get("In split size")),
        "out_split": _ranks(args.get("Out split size")),
    }


def load_rank(path: str | os.PathLike, rank: int | None = None) -> RankTrace:
    """Stream one trace file into a :class:`RankTrace`. The rank comes from
    ``distributedInfo.rank`` unless given; a file with neither is a ValueError."""
    reader = KinetoTraceReader(path)
    info = reader.distributed_info
    if rank is None:
        if "rank" not in info:
            raise ValueError(f"{reader.path}: no distributedInfo.rank; pass the rank")
        rank = int(info["rank"])
    world = info.get("world_size")
    out = RankTrace(reader.path, reader.meta, rank, int(world) if world is not None else None)
    float_ts = False
    for ev in reader.events():
        ts, dur, cat, name = ev.get("ts"), ev.get("dur"), ev.get("cat"), ev.get("name", "")
        # HTA's dataframe turns the ts column to float64 when any ts is float or missing.
        float_ts = float_ts or ts is None or isinstance(ts, float)
        if name == "[memory]" and ts is not None:
            a = ev.get("args") if isinstance(ev.get("args"), dict) else {}
            out.memory.append({"ts": ts, "device_type": _int_or(a.get("Device Type"), -1),
                               "device_id": _int_or(a.get("Device Id"), -1),
                               "total_allocated": _int_or(a.get("Total Allocated"), 0),
                               "total_reserved": _int_or(a.get("Total Reserved"), 0),
                               "bytes": _int_or(a.get("Bytes"), 0)})
            continue
        if dur is None or cat is None or cat == "Trace" or ts is None:
            continue
        args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
        stream = _int_or(args.get("stream", -1), -1)
        corr = _int_or(args.get("correlation", -1), -1)
        if cat in GPU_CATS:
            out.kernels.append({
                "name": name, "cat": cat, "ts": ts, "dur": dur, "end": ts + dur,
                "device": args.get("device"), "stream": stream, "correlation": corr,
                "kernel_type": kernel_type(name),
            })
        elif cat in RUNTIME_CATS:
            out.runtime.append({"name": name, "ts": ts, "dur": dur, "tid": ev.get("tid"),
                                "correlation": corr})
        elif cat in CPU_CATS:
            out.cpu_ops.append({"name": name, "cat": cat, "ts": ts, "dur": dur,
                                "pid": ev.get("pid"), "tid": ev.get("tid"),
                                "external_id": args.get("External id")})
            m = STEP_RE.match(name)
            if m:
                out.steps.append({"step": int(m.group(1)), "ts": ts, "dur": dur,
                                  "end": ts + dur})
            if name == "record_param_comms" or "Collective name" in args:
                out.collectives.append(_collective_row(ev, args))
            elif (g := GLOO_SPAN_RE.match(name)) is not None:
                out.collectives.append(_gloo_row(ev, args, g.group(1)))
        if stream != -1 or corr >= 0 or "ProfilerStep" in name or name in DEVICE_SYNC_NAMES:
            out.hta_rows.append({"name": name, "ts": ts, "dur": dur, "stream": stream,
                                 "correlation": corr})
    _finish_hta_rows(out.hta_rows, float_ts)
    out.steps.sort(key=lambda r: r["step"])
    return out


def _finish_hta_rows(rows: list[dict], float_ts: bool) -> None:
    """Apply HTA's time rounding (RULES['ns_rounding']); ``dur`` stays so that the
    analysis can add it to re-based start times, as HTA does after aligning ranks."""
    if not float_ts:
        return
    for r in rows:
        ts = float(r["ts"])
        r["ts"] = math.ceil(ts)
        r["dur"] = math.floor(ts + float(r["dur"])) - r["ts"]


def load_ranks(paths: list[str | os.PathLike]) -> dict[int, RankTrace]:
    """Load one file per rank; two files claiming one rank, or ranks that disagree on
    the world size, are a ValueError naming the files."""
    ranks: dict[int, RankTrace] = {}
    for p in paths:
        rt = load_rank(p)
        if rt.rank in ranks:
            raise ValueError(f"{rt.path}: rank {rt.rank} already read from {ranks[rt.rank].path}")
        other = next(iter(ranks.values()), None)
        if other is not None and other.world_size != rt.world_size:
            raise ValueError(
                f"{rt.path}: world size {rt.world_size} but {other.path} says {other.world_size}"
            )
        ranks[rt.rank] = rt
    return dict(sorted(ranks.items()))


def to_table(rows: list[dict]) -> pa.Table:
    """Columnar view of one of the row lists."""
    return pa.Table.from_pylist(rows)
