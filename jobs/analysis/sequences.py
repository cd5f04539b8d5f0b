"""Per process group, the ranks' collective sequences from their flight files (jobs/flight.py):
who issued, completed and waits in what, and the first position where the ranks disagree.
Standard library only; diagnose.py builds its sentences on these."""

from __future__ import annotations

from collections import Counter

SIG = ("op", "payload_bytes", "dtype", "step")  # what must agree at one seq of one group


def _sig(e: dict) -> tuple:
    return tuple(e.get(k) for k in SIG)


def groups_of(flights: dict[int, dict]) -> list[dict]:
    """Process groups: (key, member ranks), each rank's state in it, the first mismatch."""
    found: dict[tuple, set] = {}
    for r, f in flights.items():
        for key, g in (f.get("groups") or {}).items():
            members = tuple(g.get("ranks") or ())
            found.setdefault((key, members), set()).add(r)
    out = []
    for (key, members), seen in sorted(found.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        ranks = sorted(set(members) | seen)
        per = {}
        for r in ranks:
            g = (flights.get(r, {}).get("groups") or {}).get(key)
            if r not in flights:
                per[r] = None  # no flight file: unknown
                continue
            g = g or {"issued": 0, "completed": 0, "in_flight": None, "last_completed": None,
                      "ring": []}
            per[r] = g
        out.append({"key": key, "ranks": ranks, "label": f"{key} {ranks}",
                    "per_rank": {r: None if g is None else {
                        "issued": g["issued"], "completed": g["completed"],
                        "in_flight": g.get("in_flight"), "last_completed": g.get("last_completed")}
                        for r, g in per.items()},
                    "first_mismatch": _first_mismatch(per)})
    return out


def _first_mismatch(per: dict[int, dict | None]) -> dict | None:
    """The first seq where the known ranks disagree: content (op / size / dtype / step) or
    entry (some entered it, some did not)."""
    known = {r: g for r, g in per.items() if g is not None}
    if len(known) < 2:
        return None
    rings = {r: {e["seq"]: e for e in g.get("ring") or []} for r, g in known.items()}
    lo = max((min(ring) for ring in rings.values() if ring), default=0)
    hi = max(g["issued"] for g in known.values())
    for s in range(lo, hi):
        at = {}
        for r, g in known.items():
            at[r] = rings[r].get(s) if s < g["issued"] else "not entered"
        entries = {r: e for r, e in at.items() if isinstance(e, dict)}
        sigs = Counter(_sig(e) for e in entries.values())
        if len(sigs) <= 1 and len(entries) == len(at):
            continue
        kind = "content" if len(sigs) > 1 else "entry"
        common = sigs.most_common(1)[0][0] if sigs else None
        row = {"seq": s, "kind": kind, "per_rank": {
            r: (e if not isinstance(e, dict) else {k: e.get(k) for k in SIG})
            for r, e in at.items()}}
        if kind == "content":
            odd = sorted(r for r, e in entries.items() if _sig(e) != common)
            row["odd_ranks"] = odd
            row["expected"] = dict(zip(SIG, common, strict=True))
            nxt = [e for r, e in ((r, rings[r].get(s + 1)) for r in entries if r not in odd)
                   if isinstance(e, dict)]
            row["skipped"] = sorted(r for r in odd if (nxt and _sig(entries[r]) == _sig(nxt[0]))
                                    or _skips_by_pattern(rings, r, s, common, known))
        else:
            row["odd_ranks"] = sorted(r for r, e in at.items() if e == "not entered")
            row["expected"] = dict(zip(SIG, common, strict=True)) if common else None
        return row
    return None


def _skips_by_pattern(rings, r: int, s: int, common: tuple, known: dict) -> bool:
    """Rank r skipped #s when the others have not got past it: r's entries of that step from
    #s on are the others' previous step's pattern shifted by one (steps repeat)."""
    step = common[-1]
    other = next((q for q in known if q != r and s in rings[q]), None)
    if other is None or not isinstance(step, int):
        return False
    prev = sorted((e for e in rings[other].values() if e["step"] == step - 1),
                  key=lambda e: e["seq"])
    here = [e["seq"] for e in rings[other].values() if e["step"] == step]
    if not prev or not here:
        return False
    pos = s - min(here)
    pattern = [_sig(e)[:-1] for e in prev]
    mine = [_sig(e)[:-1] for q, e in sorted(rings[r].items()) if q >= s and e["step"] == step]
    return (pos + 1 + len(mine) <= len(pattern) and bool(mine) and pattern[pos] == common[:-1]
            and mine == pattern[pos + 1:pos + 1 + len(mine)])


def waiting(f: dict | None) -> list[tuple[str, dict]]:
    """(group key, in-flight entry) of every group this rank waits in."""
    return [(k, g["in_flight"]) for k, g in ((f or {}).get("groups") or {}).items()
            if g.get("in_flight")]


def next_group(f: dict | None) -> str | None:
    """The group of the collective a rank would issue next, from its own program order: its
    previous step's collectives over all groups in time order, at the position it reached in
    the current one (steps repeat). None when unknown."""
    if not f:
        return None
    ents = sorted(((e["ts_ns"], k, e) for k, g in (f.get("groups") or {}).items()
                   for e in g.get("ring") or []), key=lambda t: t[0])
    step = f.get("step")
    prev = [k for _, k, e in ents if e["step"] == step - 1] if isinstance(step, int) else []
    done = sum(1 for _, _, e in ents if e["step"] == step)
    return prev[done] if done < len(prev) else None
