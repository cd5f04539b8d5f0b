"""Synthetic per-rank traces with known answers (times given in µs, stored in ns)."""

from __future__ import annotations

import json
from pathlib import Path

from jobs import commbytes
from jobs.spec import parse_spec

US = 1000


def meta(rank: int, world: int, coords: dict | None = None, spec: dict | None = None) -> dict:
    m = {"type": "meta", "schema": 1, "rank": rank, "step": -1, "microbatch": None,
         "world_size": world, "coords": coords or {"pp": 0, "dp": rank, "tp": 0},
         "pid": 1000 + rank, "t0_ns": 0, "clock": "host", "clock_offset_ns": 0,
         "clock_error_ns": 0, "backend": "gloo"}
    if spec is not None:
        m["spec"] = parse_spec(spec, max_world_size=1 << 30).to_dict()
    return m


def span(rank, step, name, t0, t1, cat="compute", mb=None, **kw) -> dict:
    return {"type": "span", "rank": rank, "step": step, "microbatch": mb, "name": name,
            "cat": cat, "ts_ns": int(t0 * US), "dur_ns": int((t1 - t0) * US), **kw}


def comm(rank, step, op, t0, t1, *, n, payload, group="dp", axis="dp", seq=0, is_root=False,
         **kw) -> dict:
    sent = commbytes.bytes_sent(op, payload, n, is_root=is_root)
    recv = sent if op in commbytes.RING_OPS else (payload if op == "recv" else 0.0)
    return {"type": "comm", "rank": rank, "step": step, "microbatch": None, "op": op,
            "axis": axis, "group": group, "seq": seq, "group_size": n,
            "payload_bytes": payload, "bytes_sent": sent, "bytes_recv": recv,
            "ts_ns": int(t0 * US), "dur_ns": int((t1 - t0) * US), **kw}


def mem(rank, step, t, **comps) -> dict:
    return {"type": "mem", "rank": rank, "step": step, "microbatch": None,
            "ts_ns": int(t * US), "phase": "after_step", **comps}


def end(rank, t) -> dict:
    return {"type": "end", "rank": rank, "step": -1, "microbatch": None, "ts_ns": int(t * US),
            "reason": "ok", "issued": {}, "last_completed_seq": {}}


def write(out: Path, per_rank: dict[int, list[dict]], summary: dict | None = None) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    for rank, recs in per_rank.items():
        (out / f"trace-rank{rank}.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in recs))
    if summary is not None:
        (out / "summary.json").write_text(json.dumps(summary))
    return out
