"""A strict Trace Event Format checker (the subset the export uses), written for the tests."""

from __future__ import annotations

import json
import math
from collections import defaultdict

PHASES = {"X", "M", "C", "i"}
EPS_US = 1e-6  # 1 ps: float rounding only


def _num(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def check(trace: dict, world_size: int) -> dict:
    """Raise AssertionError on any violation; return a few counts."""
    json.dumps(trace, allow_nan=False)
    assert isinstance(trace, dict) and isinstance(trace.get("traceEvents"), list)
    evs = trace["traceEvents"]
    lanes: dict[tuple, list] = defaultdict(list)
    pnames: dict[int, list] = defaultdict(list)
    counters: dict[int, int] = defaultdict(int)
    pids_used = set()
    for e in evs:
        ph = e.get("ph")
        assert ph in PHASES, e
        assert isinstance(e.get("pid"), int) and isinstance(e.get("tid"), int), e
        assert isinstance(e.get("name"), str) and e["name"], e
        if ph == "X":
            assert _num(e.get("ts")) and _num(e.get("dur")) and e["dur"] >= 0, e
            lanes[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"], e["name"]))
            pids_used.add(e["pid"])
        elif ph == "M":
            assert isinstance(e.get("args"), dict), e
            if e["name"] == "process_name":
                pnames[e["pid"]].append(e["args"].get("name"))
        elif ph == "C":
            assert _num(e.get("ts")), e
            assert e.get("args") and all(_num(v) for v in e["args"].values()), e
            counters[e["pid"]] += 1
            pids_used.add(e["pid"])
        elif ph == "i":
            assert _num(e.get("ts")) and e.get("s") in ("t", "p", "g"), e
    for key, spans in lanes.items():
        stack: list[float] = []
        for s, t, name in sorted(spans, key=lambda x: (x[0], -x[1])):
            while stack and stack[-1] <= s + EPS_US:
                stack.pop()
            assert not stack or t <= stack[-1] + EPS_US, \
                f"{key}: {name} [{s}, {t}] overlaps an enclosing span ending at {stack[-1]}"
            stack.append(t)
    assert sorted(pnames) == list(range(world_size)), pnames
    assert all(len(v) == 1 and v[0] for v in pnames.values()), pnames
    assert pids_used <= set(pnames), pids_used
    return {"spans": sum(len(v) for v in lanes.values()), "threads": len(lanes),
            "counters": dict(counters)}
