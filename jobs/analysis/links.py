"""The `links` table: measured bytes and busbw per mesh axis and link (intra- / inter-host).

A comm record's link is `inter` when the ranks of its group (a collective: the ranks sharing
every mesh coordinate but the record's axis; a send / recv: the two ends) are on more than one
host, else `intra`: the measured side of jobs/theory/links.py (docs/analysis.md).

A rank's host: the trace meta's `node_rank`, else its `hostname`, when every traced rank has
one (nothing writes them yet; a multi-host launch may); else rank // runtime.nproc_per_node of
the spec, the torchrun placement; without a spec, one host. The engine builds the table over
the columnar trace (bandwidth_links.links_table), the oracle from records (devtools/oracle/
links.py); here: the hosts, the groups and the link rule both use, and the placement table.
Standard library only.
"""

from __future__ import annotations

from collections import defaultdict

from jobs.dims import AXES, ParallelDims

from . import collectives as C
from .storage.load import Traces

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
