"""Per logical collective: bytes, duration, algbw / busbw (nccl-tests factors from
jobs.commbytes), waiting for the last rank vs transfer; the straggler rank per step
(stragglers.py).

Matching across ranks (docs/analysis.md):
  collectives  (group, seq) inside one process group; ranks of a group share every mesh
               coordinate except the group's axis, so (group, other coordinates, seq) keys one
               logical instance even when several TP / DP groups share the name `tp` / `dp`.
  send / recv  (sender, receiver, step, k) where k counts the messages of that step in that
               direction, in issue order on each side (FIFO per pair).

For one instance with arrival (issue) times a_r and completion times e_r:
  last_rank   argmax a_r;  wait_s = a_last − min a_r  (the first rank's wait for the last)
  late_s      a_last − the second-latest arrival: what the last rank alone delayed the
              instance by (had it arrived with the next-latest, the op starts that much sooner)
  others_wait_s  Σ_{r ≠ last} (a_last − a_r): rank-seconds the others spent waiting for it
  duration_s  e_last − a_last: the transfer, timed on the last-arriving rank; for send / recv
              max e_r − a_last (an isend completes at issue on the sender)
  algbw       payload / duration;  busbw = algbw · busbw_factor(op, n)
The engine matches and measures the instances over the columnar trace (instances.py), the
oracle record by record (devtools/oracle/collectives.py). Here: what both key an instance by
(group_key, resolve_peer). Standard library only.
"""

from __future__ import annotations

from jobs import commbytes

from .storage.load import Traces

NS = 1e9
P2P = set(commbytes.P2P_OPS)


def _other_coords(coords: dict, axis: str) -> tuple:
    return tuple(sorted((k, v) for k, v in coords.items() if k != axis))


# Expert parallelism carves its groups out of dp (jobs/parallel/expert.py ep_groups): an `ep`
# group is ep consecutive dp ranks, an `edp` group the dp ranks with the same index mod ep.
# Their records carry the mesh's coordinates, so the group is named by a derived one.
_DP_SUBGROUPS = {"ep": lambda dp, ep: ("dp_block", dp // ep),
                 "edp": lambda dp, ep: ("dp_lane", dp % ep)}


def ep_of(tr: Traces) -> int:
    return int(((tr.spec_dict() or {}).get("parallel") or {}).get("ep") or 1)


def group_key(tr: Traces, rank: int, axis: str, ep: int = 1) -> tuple:
    """What the members of `rank`'s group on `axis` share: every coordinate but the axis's
    (`ep`: the run's parallel.ep, ep_of)."""
    c = tr.coords(rank)
    if axis in _DP_SUBGROUPS and "dp" in c:
        k, v = _DP_SUBGROUPS[axis](c["dp"], ep)
        c = {**{a: x for a, x in c.items() if a != "dp"}, k: v}
    return _other_coords(c, axis)


def _by_coords(tr: Traces) -> dict[tuple, int]:
    return {tuple(sorted(tr.coords(r).items())): r for r in tr.ranks if tr.coords(r)}


def resolve_peer(tr: Traces, rank: int, rec: dict, index: dict) -> int | None:
    """The global rank of a point-to-point record's peer (`peer` may be global or a rank in
    the axis group: whichever names a rank that differs from this one on that axis only)."""
    q, axis = rec.get("peer"), rec.get("axis")
    if not isinstance(q, int):
        return None
    mine = tr.coords(rank)
    if not mine or axis not in mine:
        return q
    if q in tr.ranks and _other_coords(tr.coords(q), axis) == _other_coords(mine, axis):
        return q
    other = dict(mine, **{axis: q})
    return index.get(tuple(sorted(other.items())), q)
