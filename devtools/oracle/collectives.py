"""The oracle's collective tables: the instances matched record by record (as jobs/analysis/
collectives.py defines the matching), the bandwidth and axis_bytes tables over them.
Independent of the columnar engine (instances.py, bandwidth_links.py, axis_sums.py).
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from jobs import commbytes
from jobs.analysis import rules
from jobs.analysis.collectives import NS, P2P, _by_coords, ep_of, group_key, resolve_peer
from jobs.analysis.storage.load import Traces


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
