"""Mixture of experts: expert load per step and the all-to-all rank x rank matrix.

    expert_load  per (step, layer, expert): assignments routed there (`tokens`, before capacity)
                 and dropped, summed over the ranks and micro-batches of the step (`moe`
                 records); per (step, layer) `imbalance` = max / mean over the experts of
                 `tokens`, repeated on each expert's row
    all_to_all   per (step, src, dst) global ranks: bytes src's all-to-all records of the step
                 addressed to dst (`send_bytes[d]`, d the index in src's EP group), split by
                 `what`; `local` marks src == dst (those bytes never leave the rank, so the
                 row sums over dst != src are the records' `bytes_sent`)

Tensor-parallel ranks of one data-parallel replica route the same tokens (their activations
are replicated), so only tp coordinate 0 counts towards the load. An EP group is ep consecutive
dp ranks sharing the other coordinates (jobs/parallel/expert.py ep_groups), ordered by dp:
`send_bytes[d]` goes to the member with dp % ep == d. Standard library only.
"""

from __future__ import annotations

from collections import defaultdict

from . import collectives as C
from . import rules
from .storage.load import Traces

WHATS = ("dispatch", "combine", "counts")


def _counts_load(tr: Traces, rank: int) -> bool:
    return int(tr.coords(rank).get("tp", 0) or 0) == 0


def expert_load_table(tr: Traces) -> list[dict]:
    acc: dict[tuple, list] = {}  # (step, layer) -> [tokens per expert, dropped per expert]
    aux: dict[tuple, list] = defaultdict(list)
    for rank, recs in sorted(tr.ranks.items()):
        if not _counts_load(tr, rank):
            continue
        for r in recs:
            if r.get("type") != "moe" or r.get("step", -1) < 0:
                continue
            tpe = list(r.get("tokens_per_expert") or [])
            dpe = list(r.get("dropped_per_expert") or [0] * len(tpe))
            key = (r["step"], int(r.get("layer", 0)))
            a = acc.setdefault(key, [[0] * len(tpe), [0] * len(tpe)])
            assert len(a[0]) == len(tpe), f"expert count changed within layer {key[1]}"
            for e, (t, d) in enumerate(zip(tpe, dpe, strict=True)):
                a[0][e] += int(t)
                a[1][e] += int(d)
            if isinstance(r.get("aux_loss"), int | float):
                aux[key].append(float(r["aux_loss"]))
    rows = []
    for (step, layer), (tok, drop) in sorted(acc.items()):
        total = sum(tok)
        mean = total / len(tok) if tok else 0.0
        imb = max(tok) / mean if mean else None
        a = aux.get((step, layer))
        for e, (t, d) in enumerate(zip(tok, drop, strict=True)):
            rows.append({"step": step, "layer": layer, "expert": e, "tokens": t, "dropped": d,
                         "share": t / total if total else None, "imbalance": imb,
                         "aux_loss": sum(a) / len(a) if a else None})
    return rows


def _group(tr: Traces, rank: int, ep: int, cache: dict) -> list[int]:
    """The global ranks of `rank`'s EP group of size ep, ordered by dp coordinate."""
    key = (C.group_key(tr, rank, "ep", ep), ep)
    if key not in cache:
        members = [r for r in tr.ranks if (C.group_key(tr, r, "ep", ep), ep) == key]
        cache[key] = sorted(members, key=lambda r: tr.coords(r).get("dp", r))
    return cache[key]


def all_to_all_table(tr: Traces) -> list[dict]:
    acc: dict[tuple, dict] = {}
    cache: dict = {}
    for rank, recs in sorted(tr.ranks.items()):
        for r in recs:
            if r.get("type") != "comm" or r.get("op") != "all_to_all" \
                    or r.get("step", -1) < 0 or not isinstance(r.get("send_bytes"), list):
                continue
            send = r["send_bytes"]
            members = _group(tr, rank, len(send), cache)
            me = r.get("ep_rank")
            if len(members) != len(send) or not isinstance(me, int) \
                    or not 0 <= me < len(send) or members[me] != rank:
                # a rank of the group is missing from the trace (partial run) or the
                # coordinates do not name the group: its destinations cannot be placed
                tr.warnings.append(f"all_to_all: rank {rank} step {r['step']}: EP group "
                                   f"{members} does not match send_bytes of {len(send)}")
                continue
            what = r.get("what") if r.get("what") in WHATS else "other"
            for d, b in enumerate(send):
                row = acc.setdefault((r["step"], rank, members[d]), defaultdict(float))
                row["bytes"] += float(b)
                row[f"{what}_bytes"] += float(b)
    rows = []
    for (step, src, dst), v in sorted(acc.items()):
        rows.append({"step": step, "src": src, "dst": dst, "local": src == dst,
                     "bytes": v["bytes"], **{f"{w}_bytes": v.get(f"{w}_bytes", 0.0)
                                             for w in WHATS}})
    return rows


def headline(load_rows: list[dict]) -> dict:
    """expert_imbalance: median over the steady steps of the step's worst layer `imbalance`;
    dropped_tokens_fraction: dropped / routed assignments over the steady steps, every layer;
    hottest_expert: the expert with the most routed tokens over the steady steps, every layer."""
    per_step: dict[int, float | None] = {}
    for r in load_rows:
        if r["imbalance"] is not None:
            per_step[r["step"]] = max(per_step.get(r["step"]) or 0.0, r["imbalance"])
    steady = set(rules.steady(r["step"] for r in load_rows))
    use = [r for r in load_rows if r["step"] in steady]
    routed = sum(r["tokens"] for r in use)
    by_expert: dict[int, int] = defaultdict(int)
    for r in use:
        by_expert[r["expert"]] += r["tokens"]
    return {"expert_imbalance": rules.median_steady(per_step) if per_step else None,
            "dropped_tokens_fraction": sum(r["dropped"] for r in use) / routed if routed
            else None,
            "hottest_expert": max(by_expert, key=lambda e: (by_expert[e], -e))
            if by_expert else None}
