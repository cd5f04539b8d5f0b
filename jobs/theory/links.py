"""Two links: which mesh axes cross hosts, and the predicted time of each axis on its link.

Placement (docs/conventions.md "Two links"): rank r runs on host r // nproc_per_node (torchrun
--nnodes N --node-rank i gives node i the ranks i*nproc_per_node ...). The mesh order is
jobs.dims's, tp innermost: rank = (pp_idx*dp + dp_idx)*tp + tp_idx, so TP groups are
neighbouring ranks and stay inside a host when tp divides nproc_per_node, and PP / DP groups
cross hosts first (seed 004: TP up to the GPUs of one machine, PP across machines, DP the rest).

An axis group crosses if its ranks sit on more than one host; an axis is `inter` if any of its
groups crosses (the step waits for its slowest group). A ring over a group that spans hosts
moves the same bytes over every edge in lock-step, so the slowest edge, the inter-host link,
bounds it: time = bytes sent per rank / inter busbw. Bandwidths are nccl-tests bus bandwidths
(jobs/commbytes.py): bytes each rank sends / busbw is the transfer time, for every op.
Standard library only.
"""

from __future__ import annotations

import math

from jobs.dims import AXES

GB = 1e9
# Nominal one-direction bandwidths per rank, the seed 004 hardware figures: NVLink 5.0 (B200)
# 1.8 TB/s counts both directions -> 900 GB/s one way (seed 003 uses one direction);
# InfiniBand ~0.05 TB/s = 50 GB/s (one 400 Gb/s NIC per GPU). A measured collective sweep
# (intra: one host; inter: ranks on two hosts) should replace them.
DEFAULT_INTRA_GBPS = 900.0
DEFAULT_INTER_GBPS = 50.0
LINKS = ("intra", "inter")
CONVENTION = ("rank r on host r // nproc_per_node; an axis is inter if any of its groups spans "
              "hosts; a ring spanning hosts runs at the slowest (inter-host) link; axes do not "
              "overlap each other; time = bytes sent per rank / link busbw")


def _stride(dp: int, tp: int, pp: int, ep: int = 1) -> dict[str, int]:
    out = {"tp": 1, "dp": tp, "pp": tp * dp}
    if ep > 1:  # EP group: ep consecutive dp ranks; expert-DP: the dp ranks equal mod ep
        out.update(ep=tp, edp=tp * ep)
    return out


def _crossing_below(x: int, c: int, span: int) -> int:
    """Bases y < x whose group (y .. y + span, span < c) crosses: y mod c >= c - span."""
    return (x // c) * span + max(0, x % c - (c - span))


def axis_crossing(dp: int, tp: int, pp: int, nproc_per_node: int,
                  nnodes: int | None = None, ep: int = 1) -> dict[str, dict]:
    """axis -> {"group_size", "groups", "groups_crossing", "link"} for the jobs.dims layout.

    Exact without listing ranks: the groups of an axis of size n and stride s tile the ranks in
    blocks of n*s consecutive ranks, s groups per block with bases o + t (t < s). A group with
    base b spans ranks b .. b + D, D = (n-1)*s, and crosses iff b // c != (b + D) // c (c =
    nproc_per_node). The blocks repeat every c / gcd(n*s, c) blocks, so at most c blocks are
    looked at. `nnodes` = 1 (one host) short-cuts: nothing crosses. With ep > 1 the axes ep
    (size ep, stride tp: rank = ((pp*dp/ep + g)*ep + j)*tp + t) and edp (size dp/ep, stride
    ep*tp) tile the ranks the same way (jobs/parallel/expert.py's groups)."""
    c = nproc_per_node
    if c < 1:
        raise ValueError(f"nproc_per_node must be >= 1, got {c}")
    world = dp * tp * pp
    size = {"dp": dp, "tp": tp, "pp": pp, "ep": ep, "edp": dp // ep}
    out = {}
    for axis, s in _stride(dp, tp, pp, ep).items():
        n = size[axis]
        groups, span = world // n, (n - 1) * s
        blocks, block = world // (n * s), n * s
        if n == 1 or nnodes == 1:
            crossing = 0
        elif span >= c:
            crossing = groups
        else:
            period = c // math.gcd(block, c)
            crossing = 0
            for k in range(min(period, blocks)):
                times = blocks // period + (k < blocks % period)
                o = k * block
                crossing += times * (_crossing_below(o + s, c, span) -
                                     _crossing_below(o, c, span))
        out[axis] = {"group_size": n, "groups": groups, "groups_crossing": crossing,
                     "link": "inter" if crossing else "intra"}
    return out


def brute_axis_crossing(dims, nproc_per_node: int, ep: int = 1) -> dict[str, int]:
    """axis -> groups crossing, by listing every group with jobs.dims (tests; small worlds);
    ep / edp as jobs/parallel/expert.ep_groups carves them out of each dp group."""
    def sub(axis, r):
        g = dims.group_ranks("dp", r)
        i = g.index(r)
        return g[i // ep * ep:(i // ep + 1) * ep] if axis == "ep" else g[i % ep::ep]
    out = {}
    for axis in AXES + (("ep", "edp") if ep > 1 else ()):
        seen, crossing = set(), 0
        for r in range(dims.world_size):
            g = tuple(sub(axis, r) if axis in ("ep", "edp") else dims.group_ranks(axis, r))
            if g in seen:
                continue
            seen.add(g)
            crossing += len({q // nproc_per_node for q in g}) > 1
        out[axis] = crossing
    return out


def link_bandwidths(w: dict) -> dict[str, tuple[float, str]]:
    """link -> (busbw GB/s, where it came from): the link's own field, else bandwidth_GBps
    (one figure for both links, as before there were two), else the documented default."""
    out = {}
    for link, default, name in (("intra", DEFAULT_INTRA_GBPS, "NVLink"),
                                ("inter", DEFAULT_INTER_GBPS, "InfiniBand")):
        own = w.get(f"{link}_bandwidth_GBps")
        if own is not None:
            out[link] = (own, f"{link}_bandwidth_GBps")
        elif w.get("bandwidth_GBps") is not None:
            out[link] = (w["bandwidth_GBps"], "bandwidth_GBps")
        else:
            out[link] = (default, f"default ({name}, seed 004)")
    return out


def has_bandwidth(w: dict) -> bool:
    """Whether a comm time is asked for: any bandwidth given (defaults alone do not make one)."""
    return any(w.get(k) is not None for k in ("bandwidth_GBps", "intra_bandwidth_GBps",
                                                "inter_bandwidth_GBps"))


def links_section(w: dict, comps: dict[str, float]) -> dict:
    """The comm section's `links`: per axis bytes per rank per step (`comps`, from the comm
    model), its link and the time on it; per link the sums."""
    npn = w["nproc_per_node"] or w["dp"] * w["tp"] * w["pp"]
    ep = w.get("ep") or 1
    cross = axis_crossing(w["dp"], w["tp"], w["pp"], npn, w["nnodes"], ep)
    cp = w.get("cp") or 1
    if cp > 1:  # CP groups are cp consecutive DP ranks, laid out as EP's groups are
        cross["cp"] = axis_crossing(w["dp"], w["tp"], w["pp"], npn, w["nnodes"], cp)["ep"]
    bws = link_bandwidths(w)
    rows = []
    for axis in ("tp", "dp", "pp") + (("ep", "edp") if ep > 1 else ()) + \
            (("cp",) if cp > 1 else ()):
        link = cross[axis]["link"]
        bw, source = bws[link]
        b = comps.get(axis, 0.0)
        rows.append({"axis": axis, **cross[axis], "bytes_per_rank": b, "busbw_GBps": bw,
                     "bandwidth_source": source, "time_s": b / (bw * GB)})
    per_link = {}
    for link in LINKS:
        mine = [r for r in rows if r["link"] == link]
        per_link[link] = {"axes": [r["axis"] for r in mine],
                          "bytes_per_rank": sum(r["bytes_per_rank"] for r in mine),
                          "busbw_GBps": bws[link][0], "bandwidth_source": bws[link][1],
                          "time_s": sum(r["time_s"] for r in mine)}
    return {"nnodes": w["nnodes"], "nproc_per_node": npn, "per_axis": rows,
            "per_link": per_link, "time_s": sum(r["time_s"] for r in rows),
            "convention": CONVENTION}
