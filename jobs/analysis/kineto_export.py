"""A run's traces as PyTorch profiler (Kineto) Chrome-trace documents, one per rank, for
Holistic Trace Analysis (HTA) and the TensorBoard profiler plugin.

HTA's temporal breakdown (idle / compute / non-compute) and its communication-computation
overlap are defined over GPU kernels on streams. A paralab run has no GPU: the rank's compute
and communication spans are written as synthetic `kernel` events on device 0, one stream for
compute (COMPUTE_STREAM) and one for communication (COMM_STREAM), so that HTA measures what
paralab's step_rank table measures (docs/trace-schema.md "Kineto export" states the mapping):

  compute kernel   each outermost `compute` span (forward, backward, optimizer, F / B / W),
                   minus the blocking communication nested in it (steps.is_blocking), named
                   after the span
  comm kernel      each `comm` record [issue, completion], named `ncclDevKernel_<Op>_gloo`
                   (HTA's COMMUNICATION rule is the name ^nccl.*Kernel), with the
                   record_param_comms args
  host             ProfilerStep#N (user_annotation) per `step` span, every other span as a
                   cpu_op, per comm record torch's gloo span `gloo:<op>` (issue to completion,
                   on a "gloo" thread, with the record_param_comms args: TensorBoard finds
                   gloo communication by that name), and per kernel a `cudaLaunchKernel`
                   (cuda_runtime) at its start carrying its correlation id (HTA keeps a
                   kernel only when a host event has its correlation)

Times are µs (3 decimals) from `baseTimeNanoseconds`, the run's origin (the Perfetto export's).
Records are read with perfetto.py's path (one rank at a time from the Parquet traces).
Standard library only.
"""

from __future__ import annotations

import json
import re

from . import intervals as iv
from .export import assign_lanes, event_chunks
from .steps import _end, is_blocking
from .storage.load import Traces

SCHEMA_VERSION = 1
DEVICE = 0
COMPUTE_STREAM = 7
COMM_STREAM = 20
LANE_STRIDE = 100  # overlapping kernels of one kind go to stream + 100 * lane
HOST_TID = 1
GLOO_TID = 1000
ZIP_FLUSH = 1 << 20
KINETO_DTYPES = {"float32": "Float", "float16": "Half", "bfloat16": "BFloat16",
                 "float64": "Double", "int64": "Long", "int32": "Int", "int8": "Char",
                 "uint8": "Byte", "bool": "Bool"}
# the profiler's "Input type" names (TensorBoard sizes a collective by them)
TORCH_TYPES = {"Float": "float", "Double": "double", "Half": "c10::Half",
               "BFloat16": "c10::BFloat16", "Long": "long int", "Int": "int",
               "Byte": "unsigned char", "Char": "signed char", "Bool": "bool"}
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int64": 8,
               "int32": 4, "int8": 1, "uint8": 1, "bool": 1}
# paralab op -> (torch's "Collective name", NCCL kernel family)
COLLECTIVES = {"all_reduce": ("allreduce", "AllReduce"), "all_gather": ("allgather", "AllGather"),
               "reduce_scatter": ("reduce_scatter", "ReduceScatter"),
               "broadcast": ("broadcast", "Broadcast"), "reduce": ("reduce", "Reduce"),
               "send": ("send", "SendRecv"), "recv": ("recv", "SendRecv"),
               "all_to_all": ("all_to_allv", "SendRecv")}
_P2P = re.compile(r":p2p:(\d+)-(\d+)$")


def kernel_name(op: str) -> str:
    fam = COLLECTIVES.get(op, (op, "".join(w.title() for w in op.split("_"))))[1]
    return f"ncclDevKernel_{fam}_gloo"


def nelems(r: dict) -> tuple[int | None, int | None, str]:
    """(In msg nelems, Out msg nelems, Kineto dtype) of a comm record from `payload_bytes`
    (the schema's S: reduce-scatter's input, all-gather's output, else the array); bytes
    (dtype Byte) when the record names no known dtype."""
    size = r.get("payload_bytes")
    dt = r.get("dtype")
    if not isinstance(size, int):
        return None, None, KINETO_DTYPES.get(dt, "Byte")
    elem = DTYPE_BYTES.get(dt)
    n = size // elem if elem else size
    g = r.get("group_size") if isinstance(r.get("group_size"), int) else 1
    kind = KINETO_DTYPES.get(dt, "Byte") if elem else "Byte"
    if r.get("op") == "all_gather":
        return n // max(g, 1), n, kind
    if r.get("op") == "reduce_scatter":
        return n, n // max(g, 1), kind
    return n, n, kind


def _members(meta: Traces, rank: int, axis: str) -> list[int]:
    """The global ranks of `rank`'s group along a mesh axis (same coordinates but that one),
    in the axis' order; [] when the rank has no such coordinate."""
    mine = meta.coords(rank)
    if axis not in mine:
        return []
    rest = {k: v for k, v in mine.items() if k != axis}
    peers = [(meta.coords(r).get(axis), r) for r in sorted(meta.meta)
             if {k: v for k, v in meta.coords(r).items() if k != axis} == rest]
    return [r for _, r in sorted(peers, key=lambda x: (x[0] is None, x[0] or 0, x[1]))]


def process_groups(meta: Traces, rank: int, recs: list[dict]) -> list[dict]:
    """distributedInfo.pg_config: the default group (every rank), then each `group` this
    rank's comm records name; `ranks` from the mesh coordinates, [] where they do not say."""
    world = meta.world_size
    out = [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cpu:gloo",
            "pg_size": world, "ranks": list(range(world))}]
    seen: dict[str, dict] = {}
    for r in recs:
        if r.get("type") != "comm":
            continue
        g = str(r.get("group", r.get("axis", "?")))
        if g in seen:
            continue
        axis = str(r.get("axis", g)).split(":")[0]
        size = r.get("group_size") if isinstance(r.get("group_size"), int) else None
        members = _members(meta, rank, axis)
        m = _P2P.search(g)
        if m and all(int(i) < len(members) for i in m.groups()):
            members = [members[int(i)] for i in m.groups()]
        if size is not None and len(members) != size:
            members = list(range(world)) if size == world else []
        seen[g] = {"pg_name": g, "pg_desc": f"paralab group {g} (axis {axis})",
                   "backend_config": "cpu:gloo", "pg_size": size or len(members),
                   "ranks": members}
    return out + list(seen.values())


def _outermost(spans: list[dict]) -> list[dict]:
    """The compute spans not nested in another compute span (forward, not forward.layer)."""
    out, top = [], None
    for r in sorted(spans, key=lambda r: (r["ts_ns"], -_end(r))):
        if top is not None and top[0] <= r["ts_ns"] and _end(r) <= top[1]:
            continue
        out.append(r)
        top = (r["ts_ns"], _end(r))
    return out


def rank_events(meta: Traces, rank: int, recs: list[dict], t0: int):
    """The Kineto events of one rank (host, then kernels, then metadata)."""
    def us(ns: int) -> float:
        return round((ns - t0) / 1000.0, 3)

    def x(name, cat, s, e, pid, tid, args):
        return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": us(s),
                "dur": round(us(e) - us(s), 3), "args": args}

    host_pid = (meta.meta.get(rank) or {}).get("pid")
    host_pid = host_pid if isinstance(host_pid, int) else 100000 + rank
    timed = [r for r in recs if r.get("type") in ("span", "comm") and "ts_ns" in r]
    by_step: dict = {}
    for r in timed:
        by_step.setdefault(r.get("step"), []).append(r)
    pg_ranks = {g["pg_name"]: g["ranks"] for g in process_groups(meta, rank, recs)}
    host, gloo, kernels = [], [], []  # (start, end, event)
    ext, corr = 0, 0
    for _step, srecs in by_step.items():
        comp = [r for r in srecs if r["type"] == "span" and r.get("cat") == "compute"]
        comp_iv = [(r["ts_ns"], _end(r)) for r in comp]
        comms = [r for r in srecs if r["type"] == "comm"]
        blocking = {id(c) for c in comms if is_blocking(c, comp_iv)}
        cuts = iv.union((c["ts_ns"], _end(c)) for c in comms if id(c) in blocking)
        tops = {id(r) for r in _outermost(comp)}
        for r in srecs:
            ext += 1
            s, e = r["ts_ns"], _end(r)
            if r["type"] == "span":
                step = r.get("step")
                if r.get("cat") == "step" and isinstance(step, int) and step >= 0:
                    name, cat = f"ProfilerStep#{step}", "user_annotation"
                else:
                    name, cat = str(r.get("name", "span")), "cpu_op"
                args = {"External id": ext, **{k: r[k] for k in ("step", "microbatch",
                        "layer", "phase", "cat") if r.get(k) is not None}}
                host.append((s, e, x(name, cat, s, e, host_pid, HOST_TID, args)))
                pieces = iv.subtract([(s, e)], cuts) if id(r) in tops else []
                kname, kargs = name, {}
            else:
                n_in, n_out, dt = nelems(r)
                cname = COLLECTIVES.get(str(r.get("op")), (str(r.get("op")),))[0]
                g = str(r.get("group", r.get("axis", "?")))
                kargs = {"Collective name": cname, "In msg nelems": n_in,
                         "Out msg nelems": n_out, "dtype": dt,
                         "Group size": r.get("group_size"), "Process Group Name": g,
                         "Process Group Description": f"paralab group {g}",
                         "Process Group Ranks": str(pg_ranks.get(g, [])), "Seq": r.get("seq")}
                # torch's gloo span runs on gloo's thread from issue to completion
                shapes = {"Input Dims": [[n_in]], "Input type": [TORCH_TYPES.get(dt, dt)]} \
                    if n_in is not None else {}
                gloo.append((s, e, x(f"gloo:{r.get('op')}", "cpu_op", s, e, host_pid,
                                     GLOO_TID, {"External id": ext, **kargs, **shapes})))
                pieces, kname = [(s, e)], kernel_name(str(r.get("op")))
            for a, b in pieces:
                corr += 1
                ids = {"External id": ext, "correlation": corr}
                host.append((a, a, x("cudaLaunchKernel", "cuda_runtime", a, a, host_pid,
                                     HOST_TID, dict(ids))))
                kernels.append((a, b, r["type"], x(kname, "kernel", a, b, DEVICE, 0,
                                                   {**ids, **kargs, "device": DEVICE})))
    yield from _lay_out(host, gloo, kernels, host_pid, rank, us)


def _lay_out(host, gloo, kernels, host_pid, rank, us):
    """Host events on nesting threads, kernels on their streams, then the metadata."""
    threads = {}
    for evs, tid0, tname in ((host, HOST_TID, "host"), (gloo, GLOO_TID, "gloo")):
        for lane, ev in assign_lanes(evs):
            ev["tid"] = tid0 + lane
            threads[ev["tid"]] = tname if lane == 0 else f"{tname} #{lane + 1}"
            yield ev
    streams = {}
    for kind, base in (("span", COMPUTE_STREAM), ("comm", COMM_STREAM)):
        mine = [(a, b, ev) for a, b, k, ev in kernels if k == kind]
        for lane, ev in assign_lanes(mine):
            stream = base + LANE_STRIDE * lane
            ev["tid"] = ev["args"]["stream"] = stream
            streams[stream] = "compute" if kind == "span" else "communication"
            yield ev
    yield {"ph": "M", "name": "process_name", "pid": host_pid, "tid": 0,
           "args": {"name": f"rank {rank} host"}}
    yield {"ph": "M", "name": "process_name", "pid": DEVICE, "tid": 0,
           "args": {"name": f"rank {rank} device (synthetic: paralab compute / comm spans)"}}
    for tid, tname in sorted(threads.items()):
        yield {"ph": "M", "name": "thread_name", "pid": host_pid, "tid": tid,
               "args": {"name": tname}}
    for stream, what in sorted(streams.items()):
        yield {"ph": "M", "name": "thread_name", "pid": DEVICE, "tid": stream,
               "args": {"name": f"stream {stream} ({what})"}}
    ends = [(a, b) for a, b, _ in host + gloo] + [(a, b) for a, b, _, _ in kernels]
    if ends:
        s, e = min(a for a, _ in ends), max(b for _, b in ends)
        yield {"ph": "X", "cat": "Trace", "name": f"PyTorch Profiler (rank {rank})",
               "pid": "Spans", "tid": "PyTorch Profiler", "ts": us(s),
               "dur": round(us(e) - us(s), 3), "args": {"Op count": 0}}


def iter_rank_json(meta: Traces, rank: int, recs: list[dict], t0: int, chunk: int = 2000):
    """One rank's Kineto document as JSON text in chunks of `chunk` events."""
    pgs = process_groups(meta, rank, recs)
    head = {"schemaVersion": SCHEMA_VERSION, "deviceProperties": [],
            "distributedInfo": {"backend": "gloo", "rank": rank,
                                "world_size": meta.world_size, "pg_count": len(pgs),
                                "pg_config": pgs},
            "paralab": {"synthetic": f"no GPU: kernels on stream {COMPUTE_STREAM} are "
                        f"paralab's compute spans, on stream {COMM_STREAM} its comm records "
                        "(docs/trace-schema.md, Kineto export)",
                        "coords": meta.coords(rank)}}
    # indented like Kineto's header: HTA finds a file's rank with the regex '"rank":\s+(\d+)'
    # on the first line that matches it, so the key needs its space and comes first
    yield json.dumps(head, indent=1)[:-2] + ',\n "traceEvents": ['
    yield from event_chunks(rank_events(meta, rank, recs, t0), chunk)
    yield (f'],"traceName":"rank{rank}.pt.trace.json","displayTimeUnit":"ms",'
           f'"baseTimeNanoseconds":{int(t0)}}}')
