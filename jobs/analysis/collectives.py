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
Standard library only.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from jobs import commbytes

from . import rules
from .load import Traces

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


def match(tr: Traces) -> list[list[tuple[int, dict]]]:
    """Instances: each a list of (rank, comm record) of one logical operation."""
    inst: dict[tuple, list] = defaultdict(list)
    index = _by_coords(tr)
    ep = ep_of(tr)
    for rank, recs in sorted(tr.ranks.items()):
        counters: dict[tuple, int] = defaultdict(int)
        for r in recs:
            if r.get("type") != "comm":
                continue
            op = r.get("op")
            if op in P2P:
                peer = resolve_peer(tr, rank, r, index)
                send = op in ("send", "isend")
                pair = (rank, peer) if send else (peer, rank)
                k = (pair, r.get("step"))
                key = ("p2p", pair, r.get("step"), counters[k])
                counters[k] += 1
            else:
                axis = r.get("axis", "")
                key = ("coll", r.get("group", axis), group_key(tr, rank, axis, ep), r.get("seq"))
            inst[key].append((rank, r))
    return list(inst.values())


def instance_row(parts: list[tuple[int, dict]], clock_err: dict[int, int]) -> dict:
    recs = [r for _, r in parts]
    first = recs[0]
    op = first.get("op", "?")
    p2p = op in P2P
    if p2p:
        op = "send_recv"
    n = int(first.get("group_size") or len(parts))
    arrive = {rank: r["ts_ns"] for rank, r in parts}
    end = {rank: r["ts_ns"] + r.get("dur_ns", 0) for rank, r in parts}
    last = max(arrive, key=lambda k: (arrive[k], k))
    a_last = arrive[last]
    others = [a for k, a in arrive.items() if k != last]
    dur_ns = (max(end.values()) if p2p else end[last]) - a_last
    payload = int(first.get("payload_bytes") or 0)
    dur = max(dur_ns, 0) / NS
    expected = 2 if p2p else n
    row = {"step": min(r.get("step", -1) for r in recs), "op": op, "axis": first.get("axis"),
           "group": first.get("group"), "seq": first.get("seq"), "group_size": n,
           "ranks": sorted(arrive), "complete": len(parts) >= expected,
           "payload_bytes": payload,
           "bytes_sent": max(float(r.get("bytes_sent", 0.0)) for r in recs),
           "backend_op": first.get("backend_op"),
           "start_ns": min(arrive.values()), "last_rank": last,
           "wait_s": (a_last - min(arrive.values())) / NS,
           "late_s": (a_last - max(others)) / NS if others else 0.0,
           "others_wait_s": sum(a_last - a for a in others) / NS, "duration_s": dur,
           "span_s": (max(end.values()) - min(arrive.values())) / NS,
           "clock_error_s": max(clock_err.get(k, 0) for k in arrive) / NS,
           "algbw_GBps": None, "busbw_GBps": None}
    if dur > 0 and payload:
        bw_op = "send" if p2p else op
        try:
            row["algbw_GBps"] = commbytes.algbw(payload, dur) / 1e9
            row["busbw_GBps"] = commbytes.busbw(bw_op, payload, dur, n) / 1e9
        except ValueError:
            pass
    for k in ("phase", "bucket", "unit", "microbatch"):
        if first.get(k) is not None:
            row[k] = first[k]
    return row


def collectives_table(tr: Traces) -> list[dict]:
    clock_err = {r: int(m.get("clock_error_ns") or 0) for r, m in tr.meta.items()}
    rows = [instance_row(p, clock_err) for p in match(tr)]
    rows.sort(key=lambda r: (r["start_ns"], str(r["group"]), r["seq"] or 0))
    incomplete = sum(not r["complete"] for r in rows)
    if incomplete:
        tr.warnings.append(f"{incomplete} communication instance(s) seen on fewer ranks than "
                           "their group size (missing ranks, or a cancelled run)")
    return rows


def bandwidth_table(coll_rows: list[dict]) -> list[dict]:
    """Per (op, axis, message size, group size), over the steady steps' complete instances:
    count, median / min transfer time (`duration_s`), and the median algbw / busbw of the
    instances: what the bandwidth-vs-size chart draws and the sweep comparison joins."""
    use = set(rules.steady(r["step"] for r in coll_rows if r["step"] >= 0))
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in coll_rows:
        if r["step"] in use and r["complete"] and r["busbw_GBps"] is not None:
            groups[(r["op"], str(r["axis"]), r["payload_bytes"], r["group_size"])].append(r)
    rows = []
    for (op, axis, size, n), rs in sorted(groups.items()):
        rows.append({"op": op, "axis": axis, "payload_bytes": size, "group_size": n,
                     "instances": len(rs),
                     "duration_median_s": statistics.median(r["duration_s"] for r in rs),
                     "duration_min_s": min(r["duration_s"] for r in rs),
                     "wait_median_s": statistics.median(r["wait_s"] for r in rs),
                     "algbw_GBps": statistics.median(r["algbw_GBps"] for r in rs),
                     "busbw_GBps": statistics.median(r["busbw_GBps"] for r in rs)})
    return rows


def step_spans(tr: Traces) -> dict[int, set]:
    """rank -> the training steps (>= 0) it has a `step` span of. A rank's steps for a per-step
    figure are these and those of its comm records (axis_bytes, links)."""
    steps: dict[int, set] = defaultdict(set)
    for rank, recs in tr.ranks.items():
        for r in recs:
            if r.get("type") == "span" and r.get("cat") == "step" and r.get("step", -1) >= 0:
                steps[rank].add(r["step"])
    return steps


def axis_bytes_table(tr: Traces) -> list[dict]:
    """Per rank and mesh axis: bytes sent / received over the training steps (setup, step -1,
    apart), and per step."""
    acc: dict[tuple, list] = {}
    steps = step_spans(tr)
    for rank, recs in sorted(tr.ranks.items()):
        for r in recs:
            st = r.get("step", -1)
            if r.get("type") != "comm":
                continue
            a = acc.setdefault((rank, r.get("axis", "?")), [0.0, 0.0, 0.0, set()])
            if st >= 0:
                a[0] += float(r.get("bytes_sent", 0.0))
                a[1] += float(r.get("bytes_recv", 0.0))
                a[3].add(st)
            else:
                a[2] += float(r.get("bytes_sent", 0.0))
    rows = []
    for (rank, axis), (sent, recv, setup, st) in sorted(acc.items()):
        n = len(steps[rank] | st)
        rows.append({"rank": rank, "axis": axis, "coords": tr.coords(rank), "bytes_sent": sent,
                     "bytes_recv": recv, "setup_bytes_sent": setup, "steps": n,
                     "bytes_sent_per_step": sent / n if n else None,
                     "bytes_recv_per_step": recv / n if n else None})
    return rows
