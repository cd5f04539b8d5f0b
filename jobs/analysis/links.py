"""The `links` table: measured bytes and busbw per mesh axis and link (intra- / inter-host).

A comm record's link is `inter` when the ranks of its group (a collective: the ranks sharing
every mesh coordinate but the record's axis; a send / recv: the two ends) are on more than one
host, else `intra`: the measured side of jobs/theory/links.py (docs/analysis.md).

A rank's host: the trace meta's `node_rank`, else its `hostname`, when every traced rank has
one (nothing writes them yet; a multi-host launch may); else rank // runtime.nproc_per_node of
the spec, the torchrun placement; without a spec, one host. Standard library only.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from jobs.dims import AXES, ParallelDims

from . import collectives as C
from . import rules
from .load import Traces

HOST_KEYS = ("node_rank", "hostname")


def rank_hosts(tr: Traces, spec) -> tuple[dict[int, object], str]:
    """rank -> host, and where the hosts came from."""
    ranks = sorted(set(tr.ranks) | set(range(tr.world_size)))
    for key in HOST_KEYS:
        vals = {r: (tr.meta.get(r) or {}).get(key) for r in tr.ranks}
        if vals and all(v is not None for v in vals.values()):
            return vals, f"trace meta `{key}`"
    npn = getattr(getattr(spec, "runtime", None), "nproc_per_node", None)
    if npn:
        return {r: r // npn for r in ranks}, f"rank // nproc_per_node = {npn} (spec)"
    return dict.fromkeys(ranks, 0), "one host (no host in the trace meta, no spec)"


def _dims(tr: Traces, spec) -> ParallelDims | None:
    if spec is None or getattr(spec, "kind", None) != "train":
        return None
    try:
        return ParallelDims.from_spec(spec, tr.world_size)
    except (ValueError, AttributeError):
        return None


class _Groups:
    """Members of the group of a comm record on a rank (jobs.dims when the spec gives the
    layout, else the traced ranks' coordinates, else every rank)."""

    def __init__(self, tr: Traces, spec):
        self.tr, self.dims = tr, _dims(tr, spec)
        self.index = C._by_coords(tr)
        self.by_other: dict[tuple, list[int]] = defaultdict(list)
        for r in sorted(tr.ranks):
            c = tr.coords(r)
            for axis in c:
                self.by_other[(axis, C._other_coords(c, axis))].append(r)
        self.everyone = sorted(set(tr.ranks) | set(range(tr.world_size)))
        self.ep = C.ep_of(tr)

    def members(self, rank: int, rec: dict) -> list[int]:
        if rec.get("op") in C.P2P:
            peer = C.resolve_peer(self.tr, rank, rec, self.index)
            return [rank] if peer is None else [rank, peer]
        axis, mine = rec.get("axis"), self.tr.coords(rank)
        if self.dims is not None and axis in AXES and rank < self.dims.world_size:
            return self.dims.group_ranks(axis, rank)
        if mine and axis in mine:
            return self.by_other[(axis, C._other_coords(mine, axis))]
        if mine and axis in ("ep", "edp"):  # sub-groups of dp (collectives.group_key)
            key = C.group_key(self.tr, rank, axis, self.ep)
            return [r for r in sorted(self.tr.ranks)
                    if C.group_key(self.tr, r, axis, self.ep) == key]
        return self.everyone


def link_of(ranks, hosts: dict) -> str:
    seen = {hosts.get(r) for r in ranks} - {None}
    return "inter" if len(seen) > 1 else "intra"


def links_table(tr: Traces, spec, coll_rows: list[dict], pred: dict | None) -> list[dict]:
    """Per (axis, link): bytes sent per step by the busiest rank (over the training steps, per
    step as in axis_bytes), the ranks and instances seen there, and the median transfer time and
    busbw of the steady steps' complete instances (collectives table); next to the theory's
    link, bytes, busbw and time of that axis (predict()["comm"]["links"])."""
    hosts, source = rank_hosts(tr, spec)
    groups = _Groups(tr, spec)
    steps = C.step_spans(tr)
    sent: dict[tuple, float] = defaultdict(float)  # (rank, axis, link) -> bytes, steps >= 0
    axis_steps: dict[tuple, set] = defaultdict(set)  # (rank, axis) -> steps of its records
    for rank, recs in sorted(tr.ranks.items()):
        for r in recs:
            if r.get("type") != "comm" or r.get("step", -1) < 0:
                continue
            axis = r.get("axis", "?")
            link = link_of(groups.members(rank, r), hosts)
            sent[(rank, axis, link)] += float(r.get("bytes_sent", 0.0))
            axis_steps[(rank, axis)].add(r["step"])
    per: dict[tuple, dict] = {}
    for (rank, axis, link), b in sent.items():
        n = len(steps[rank] | axis_steps[(rank, axis)])
        row = per.setdefault((axis, link), {"ranks": set(), "per_step": []})
        row["ranks"].add(rank)
        row["per_step"].append(b / n if n else 0.0)
    use = set(rules.steady(r["step"] for r in coll_rows if r["step"] >= 0))
    inst: dict[tuple, list[dict]] = defaultdict(list)
    for r in coll_rows:
        if r["step"] in use and r["complete"] and r["busbw_GBps"] is not None:
            inst[(str(r["axis"]), link_of(r["ranks"], hosts))].append(r)
    theory = {x["axis"]: x for x in (((pred or {}).get("comm") or {}).get("links") or {})
              .get("per_axis", [])}
    rows = []
    for axis, link in sorted(set(per) | set(inst)):
        p, rs, t = per.get((axis, link), {"ranks": set(), "per_step": []}), \
            inst.get((axis, link), []), theory.get(axis, {})
        rows.append({
            "axis": axis, "link": link, "ranks": len(p["ranks"]), "instances": len(rs),
            "bytes_sent_per_step": max(p["per_step"], default=None),
            "duration_median_s": statistics.median(x["duration_s"] for x in rs) if rs else None,
            "busbw_GBps": statistics.median(x["busbw_GBps"] for x in rs) if rs else None,
            "hosts": len(set(hosts.values()) - {None}), "hosts_source": source,
            "predicted_link": t.get("link"), "predicted_bytes": t.get("bytes_per_rank"),
            "predicted_busbw_GBps": t.get("busbw_GBps"), "predicted_time_s": t.get("time_s"),
            "predicted_bandwidth_source": t.get("bandwidth_source")})
    return rows


def placement_table(tr: Traces, spec) -> list[dict]:
    """Which rank ran on which host: per rank its host (the trace meta's `hostname`, else the
    host rank_hosts derives), torch's node rank and local rank, the placement node of the
    worker that launched it, its mesh coordinates, and the bound of its clock's alignment to
    rank 0's (ns), which holds across hosts as across ranks."""
    hosts, _ = rank_hosts(tr, spec)
    out = []
    for r in sorted(tr.ranks):
        meta = tr.meta.get(r) or {}
        out.append({"rank": r, "host": str(meta.get("hostname") or hosts.get(r)),
                    "node_rank": meta.get("node_rank"), "local_rank": meta.get("local_rank"),
                    "placement_node": meta.get("placement_node"),
                    **{a: tr.coords(r).get(a) for a in AXES},
                    "clock_error_ns": meta.get("clock_error_ns")})
    return out

