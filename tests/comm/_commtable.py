"""Seed 000's all-reduce table, checked from per-rank send/recv trace records alone.

Shared by the comm tests (imported as a top-level module: tests/comm/conftest.py puts this
folder on sys.path), with the torchrun launcher they use.
A record here is a dict with at least `op` ('send' / 'recv'), `peer`, `payload_bytes`,
`algorithm` and `algo_step`, grouped by rank.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

from jobs.analysis import load_run_dir
from tests.support.launch import ROOT, torchrun  # noqa: F401  (the one launcher)


def load_traces(out: Path) -> dict[int, list[dict]]:
    """Records per rank, read by the one trace loader (jobs.analysis.load_run_dir)."""
    return load_run_dir(out).ranks


def point_steps(traces: dict[int, list[dict]], op: str, algorithm: str) -> dict[int, int]:
    """{payload_bytes: trace step} of the sweep points of (op, algorithm), from rank 0."""
    return {r["payload_bytes"]: r["step"] for r in traces[0]
            if r["type"] == "instant" and r.get("name") == "bench_point"
            and r["op"] == op and r["algorithm"] == algorithm}


def p2p_records(traces: dict[int, list[dict]], step: int) -> dict[int, list[dict]]:
    return {rank: [r for r in recs if r["type"] == "comm" and r["step"] == step
                   and r["op"] in ("send", "recv")] for rank, recs in traces.items()}


def tree_children(i: int, n: int) -> int:
    k, out = 0, 0
    while (1 << k) < n:
        if i % (1 << (k + 1)) == 0 and i + (1 << k) < n:
            out += 1
        elif i % (1 << (k + 1)) == (1 << k):
            break
        k += 1
    return out


def expected_table(algorithm: str, world: int, M: int, placement: str = "dedicated") -> dict:
    """Per-rank bytes sent, total, steps and the hub (a rank on every message) of seed 000."""
    if algorithm == "naive":
        per = {r: (world - 1) * M for r in range(world)}
        return {"per_rank": per, "total": world * (world - 1) * M, "steps": 1, "hub": None}
    if algorithm == "ps" and placement == "dedicated":
        N, server = world - 1, world - 1
        per = {r: M for r in range(N)} | {server: N * M}
        return {"per_rank": per, "total": 2 * N * M, "steps": 2, "hub": server}
    if algorithm == "ps":
        per = {r: M for r in range(1, world)} | {0: (world - 1) * M}
        return {"per_rank": per, "total": 2 * (world - 1) * M, "steps": 2, "hub": 0}
    if algorithm == "ring":
        per = {r: 2 * (world - 1) * M // world for r in range(world)}
        return {"per_rank": per, "total": 2 * (world - 1) * M, "steps": 2 * (world - 1),
                "hub": None}
    if algorithm == "tree":
        per = {r: (M if r else 0) + tree_children(r, world) * M for r in range(world)}
        return {"per_rank": per, "total": 2 * (world - 1) * M,
                "steps": 2 * math.ceil(math.log2(world)), "hub": None}
    if algorithm == "butterfly":
        L = int(math.log2(world))
        return {"per_rank": {r: M * L for r in range(world)}, "total": world * M * L,
                "steps": L, "hub": None}
    raise ValueError(algorithm)


def measured_table(recs: dict[int, list[dict]]) -> dict:
    """Per-rank bytes sent, total, steps, and every (src, dst, step, bytes) matched to a recv."""
    sends = Counter()
    recvs = Counter()
    per = {}
    steps = set()
    for rank, rs in recs.items():
        per[rank] = sum(r["payload_bytes"] for r in rs if r["op"] == "send")
        for r in rs:
            key = (rank, r["peer"]) if r["op"] == "send" else (r["peer"], rank)
            (sends if r["op"] == "send" else recvs)[(*key, r["algo_step"], r["payload_bytes"])] += 1
            if r["payload_bytes"]:
                steps.add(r["algo_step"])
    return {"per_rank": per, "total": sum(per.values()), "steps": len(steps),
            "sends": sends, "recvs": recvs}


def assert_seed_table(recs: dict[int, list[dict]], algorithm: str, world: int, M: int,
                      placement: str = "dedicated") -> dict:
    got = measured_table(recs)
    want = expected_table(algorithm, world, M, placement)
    where = f"{algorithm} ({placement}) world {world} M {M}"
    assert got["sends"] == got["recvs"], f"{where}: sends and receives do not pair up"
    assert got["per_rank"] == want["per_rank"], where
    assert got["total"] == want["total"], where
    assert got["steps"] == want["steps"], where
    for rank, rs in recs.items():
        assert all(r["algorithm"] == algorithm for r in rs), where
        if want["hub"] is not None:
            assert all(rank == want["hub"] or r["peer"] == want["hub"] for r in rs), \
                f"{where}: traffic not through rank {want['hub']}"
    return got
