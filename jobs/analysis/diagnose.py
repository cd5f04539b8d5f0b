"""Why a run hung or failed, from what its ranks left behind (docs/faults.md). Standard library
only.

Inputs in the run folder: `flight-rank{R}.json` (jobs/flight.py: per process group, issued /
completed / entered-but-not-completed collectives and a ring of the last ones; sequences.py
compares them across ranks),
`stack-rank{R}.txt` (faulthandler on SIGUSR1), `error-rank{R}.txt` (a rank's exception), and
the exit codes the worker read from torchrun's failure report (`exit_codes_from_log`).

    last_progress_ns(out_dir) -> int | None    the worker's hang detector polls it
    diagnose(out_dir, *, status, exit_codes=None) -> dict
    write_diagnosis(out_dir, **kw) -> dict     also writes OUT/diagnosis.json

The sentence leads with the cause, in this order: a non-finite loss (its source rank and
step); a rank that failed first (its error and where it raised, and where the others were
waiting); the first position where a group's sequences disagree (a skipped or altered
collective); a rank the others wait for (it never entered the collective they are in).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from . import stacks as ST
from .sequences import groups_of as _groups
from .sequences import next_group as _next_group
from .sequences import waiting as _waiting

DIAGNOSIS_FILE = "diagnosis.json"


def read_flights(out_dir) -> dict[int, dict]:
    out = {}
    for p in Path(out_dir).glob("flight-rank*.json"):
        try:
            d = json.loads(p.read_text())
            out[int(d["rank"])] = d
        except (OSError, ValueError, KeyError, TypeError):
            continue  # being replaced right now (os.replace: rare), or foreign
    return out


def last_progress_ns(out_dir) -> int | None:
    """The latest completed step or collective over all ranks (aligned clock, ns since the
    epoch on rank 0's wall clock); None before any flight file exists."""
    vals = [f.get("last_progress_ns") for f in read_flights(out_dir).values()]
    vals = [v for v in vals if isinstance(v, int)]
    return max(vals) if vals else None


_FAIL = re.compile(r"rank\s*:\s*(\d+)[^\n]*\n\s*exitcode\s*:\s*(-?\d+)")


def exit_codes_from_log(text: str) -> dict[int, int]:
    """{global rank: exit code} from torchrun's failure report ("rank : 1 (local_rank: 1)" then
    "exitcode : 3 (pid: ...)"); negative codes are signals (-15: stopped by torchrun)."""
    return {int(r): int(c) for r, c in _FAIL.findall(text or "")}


def ranks_text(ranks) -> str:
    """'rank 3', 'ranks 0-2', 'ranks 0, 2, 5'."""
    rs = sorted(set(ranks))
    if len(rs) == 1:
        return f"rank {rs[0]}"
    if len(rs) > 2 and rs == list(range(rs[0], rs[-1] + 1)):
        return f"ranks {rs[0]}-{rs[-1]}"
    return "ranks " + ", ".join(map(str, rs))


def _desc(e: dict) -> str:
    dt = f" {e['dtype']}" if e.get("dtype") else ""
    return f"{e.get('op')} of {e.get('payload_bytes')} B{dt} at step {e.get('step')}"


def _errors(out_dir: Path) -> dict[int, str]:
    out = {}
    for p in out_dir.glob("error-rank*.txt"):
        try:
            out[int(p.stem.removeprefix("error-rank"))] = p.read_text(errors="replace")
        except (OSError, ValueError):
            continue
    return out


def _stacks(out_dir: Path) -> dict[int, str]:
    out = {}
    for p in out_dir.glob("stack-rank*.txt"):
        try:
            text = p.read_text(errors="replace")
        except OSError:
            continue
        if text.strip():
            out[int(p.stem.removeprefix("stack-rank"))] = text
    return out


def _error_line(text: str) -> str:
    first = text.strip().splitlines()[0] if text.strip() else ""
    return re.sub(r"^rank \d+: ", "", first)


# errors a rank gets because a peer failed first (gloo / NCCL wording)
PEER_ERROR = re.compile(r"closed by peer|reset by peer|remote worker|Broken pipe|"
                        r"NCCL communicator was aborted|Timed out|timeout", re.I)
STOPPED = (-15, -9)  # SIGTERM / SIGKILL: torchrun (or the worker) stopped the rank
SIGNALS = {6: "SIGABRT", 11: "SIGSEGV", 7: "SIGBUS", 8: "SIGFPE", 9: "SIGKILL", 15: "SIGTERM"}
_FATAL = re.compile(r"^Fatal Python error: (.+)$", re.M)


def _fail_time(r: int, flights: dict, out_dir: Path) -> float:
    f = flights.get(r) or {}
    for k in ("exit", "closed"):
        if isinstance(f.get(k), dict) and f[k].get("ts_ns"):
            return f[k]["ts_ns"] / 1e9
    p = out_dir / f"error-rank{r}.txt"
    return p.stat().st_mtime if p.exists() else float("inf")


def _coll(e: dict, group: dict | str) -> str:
    label = group["label"] if isinstance(group, dict) else group
    return f"{e.get('op')} #{e.get('seq')} of group {label}"


def diagnose(out_dir, *, status: str, exit_codes: dict[int, int] | None = None) -> dict:
    """{"status", "sentence", "waited_for", "ranks", "groups", "left", "stacks", "errors",
    "nonfinite"} of a stopped run (any status: a completed run's sequences are compared too)."""
    out_dir = Path(out_dir)
    flights, errors, stacks = read_flights(out_dir), _errors(out_dir), _stacks(out_dir)
    codes = {int(k): int(v) for k, v in (exit_codes or {}).items()}
    world = max([f.get("world_size") or 0 for f in flights.values()] +
                [r + 1 for r in (*flights, *errors, *codes)] + [0])
    groups = _groups(flights)
    by_key: dict[tuple[str, int], dict] = {}
    for g in groups:
        for r in g["ranks"]:
            by_key[(g["key"], r)] = g
    summ = {r: ST.stack_summary(t) for r, t in stacks.items()}
    ranks, left = [], []
    for r in range(world):
        f = flights.get(r)
        waits = _waiting(f)
        code = codes.get(r)
        ex = (f or {}).get("exit")
        if ex and code is None:
            code = ex.get("code")
        err = errors.get(r)
        fatal = _FATAL.findall(stacks.get(r, ""))
        signal_words = (f"killed by signal {-code} ({SIGNALS.get(-code, '?')})"
                        + (f": {fatal[-1]}" if fatal else "")) if code and code < 0 else None
        if err:
            state = f"crashed: {_error_line(err)}"
        elif code is not None and code > 0:
            state = f"exited with code {code}"
        elif code is not None and code < 0 and code not in STOPPED:
            state = signal_words
        elif waits:  # also when stopped: what it was doing when the stop came (a hang's
            # watch SIGKILLs the waiting ranks, and whether torchrun saw those deaths before
            # its own SIGTERM is a race: the state must not depend on it)
            k, e = waits[0]
            state = f"waiting in {_coll(e, by_key.get((k, r), k))}"
        elif code is not None and code < 0:
            state = f"stopped by signal {-code}"
        elif f is None:
            state = "unknown (no flight file)"
        elif (f.get("closed") or {}).get("reason") == "ok":
            state = "finished"
        else:
            state = "running"
        if err or (code is not None and code not in STOPPED and code != 0):
            if err:
                tb = ST.repo_frame(ST.traceback_frames(err))
            else:  # a fatal signal: faulthandler's dump (if any) says where
                tb = (summ.get(r) or {}).get("frame") if fatal else None
            words = _error_line(err) if err else (ex or {}).get("reason") or signal_words
            left.append({"rank": r, "exit_code": code, "last_words": words,
                         "where": ST.where(tb), "step": (f or {}).get("step"),
                         "raised": bool(err), "peer_error": bool(err and PEER_ERROR.search(
                             _error_line(err))), "t": _fail_time(r, flights, out_dir)})
        groups_r = {}
        for k, g in ((f or {}).get("groups") or {}).items():
            groups_r[k] = {"issued": g["issued"], "completed": g["completed"],
                           "in_flight": g.get("in_flight"),
                           "last_completed": g.get("last_completed")}
        ranks.append({"rank": r, "coords": (f or {}).get("coords"), "state": state,
                      "step": (f or {}).get("step"),
                      "steps_completed": (f or {}).get("steps_completed"),
                      "groups": groups_r, "stack": (summ.get(r) or {}).get("where"),
                      "stack_innermost": (summ.get(r) or {}).get("innermost")})
    left.sort(key=lambda x: (x["peer_error"], x["t"], x["rank"]))
    nonfinite = {r: f["nonfinite"] for r, f in flights.items() if f.get("nonfinite")}
    sentence, waited_for = _sentence(flights, groups, left, nonfinite, summ, by_key, status)
    for x in left:
        # lost_peer: the rank only reports a peer's failure (a victim, not a cause): the run
        # page lists these after the rank that failed first, grouped by what they said
        x["lost_peer"] = x.pop("peer_error", False)
        for k in ("t", "raised"):
            x.pop(k, None)
    return {"status": status, "sentence": sentence, "waited_for": waited_for,
            "ranks": ranks, "groups": groups, "left": left, "nonfinite": nonfinite,
            "stacks": {r: stacks[r] for r in sorted(stacks)},
            "errors": {r: errors[r] for r in sorted(errors)}}


def _waiters_text(flights, by_key, exclude) -> str:
    """'ranks 0, 2 were waiting in all_reduce #12 of group dp [0, 1, 2]' (grouped)."""
    where: dict[str, list[int]] = {}
    for r, f in sorted(flights.items()):
        if r in exclude:
            continue
        w = _waiting(f)
        if w:
            k, e = w[0]
            where.setdefault(_coll(e, by_key.get((k, r), k)), []).append(r)
    return "; ".join(f"{ranks_text(rs)} {'was' if len(rs) == 1 else 'were'} waiting in {c}"
                     for c, rs in where.items())


def _sentence(flights, groups, left, nonfinite, summ, by_key, status):
    if nonfinite:
        src = [r for r, n in nonfinite.items() if n.get("what") == "loss"]
        step = min(n["step"] for n in nonfinite.values())
        first = sorted(r for r in (src or nonfinite) if nonfinite[r]["step"] == step) or \
            sorted(src or nonfinite)
        n0 = nonfinite[first[0]]
        others = sorted(r for r in nonfinite if r not in first)
        s = (f"{ranks_text(first)}: non-finite local {n0['what']} ({n0['value']}) at step "
             f"{n0['step']}")
        if others:
            s += (f"; {ranks_text(others)} then held non-finite parameters (their own loss was "
                  "finite: the values came through the gradient reduction)")
        return s, first[0]
    mm = next((g for g in groups if g["first_mismatch"]
               and g["first_mismatch"]["kind"] == "content"), None)
    lead = None
    if mm:
        m = mm["first_mismatch"]
        odd, exp = m["odd_ranks"], m["expected"]
        same = sorted(r for r, e in m["per_rank"].items() if isinstance(e, dict)
                      and r not in odd)
        if m["skipped"]:
            lead = (f"{ranks_text(m['skipped'])} skipped {exp['op']} #{m['seq']} of group "
                    f"{mm['label']} at step {exp['step']} (its #{m['seq']} is the others' "
                    f"#{m['seq'] + 1})")
        else:
            e = m["per_rank"][odd[0]]
            lead = (f"{mm['label']} disagrees at #{m['seq']}: {ranks_text(odd)} issued "
                    f"{_desc(e)} where {ranks_text(same)} issued {_desc(exp)}")
        waited = (m["skipped"] or odd)[0]
    crash = None
    hang, hang_rank = _hang_sentence(flights, groups, summ, by_key)
    # a rank that only reports a peer's failure (a victim: the hang's kill closed its
    # connection) is not the cause when the flight files name one: the hang sentence then
    own = [x for x in left if not x["peer_error"]]
    first = own[0] if own else (left[0] if left and not hang else None)
    if first is not None:
        x = first
        if x["raised"]:
            what = f"raised {x['last_words']}"
        elif x["exit_code"] is not None and x["exit_code"] > 0:
            what = f"exited with code {x['exit_code']}" + (
                f" ({x['last_words']})" if x["last_words"] else "")
        else:
            what = f"was {x['last_words']}"
        crash = f"rank {x['rank']} {what}"
        if x["where"]:
            crash += f" at {x['where']}"
        if x["step"] is not None:
            crash += f" in step {x['step']}"
        w = _waiters_text(flights, by_key, {x["rank"]})
        crash += f"; {w}" if w else ""
    if lead:
        then = crash or hang
        return lead + (f"; then {then}" if then else ""), waited
    if crash:
        return crash, first["rank"]
    if hang:
        return hang, hang_rank
    return (f"no rank is waiting in a traced collective (status {status})", None)


def _hang_sentence(flights, groups, summ, by_key):
    """The rank the others wait for: a member of a group that never entered the collective
    the others are waiting in (following chains: a laggard itself waiting elsewhere)."""
    best = None
    for g in groups:
        waits = {r: (g["per_rank"][r] or {}).get("in_flight") for r in g["ranks"]}
        waits = {r: e for r, e in waits.items() if e}
        if not waits:
            continue
        seq = max(e["seq"] for e in waits.values())
        e = next(e for e in waits.values() if e["seq"] == seq)
        lag = [r for r in g["ranks"] if g["per_rank"][r] is not None
               and g["per_rank"][r]["issued"] <= seq]
        if lag:
            free = [r for r in lag if not _waiting(flights.get(r))]  # the chain's end
            nxt = _next_group(flights.get((free or lag)[0]))
            cand = (0 if free else 1, 0 if g["key"] == nxt else 1, g["key"], seq)
            if best is None or cand < best[0]:
                best = (cand, g, e, lag, free, sorted(waits))
    if best is None:
        all_w = [(r, _waiting(f)) for r, f in sorted(flights.items()) if _waiting(f)]
        if not all_w:
            return None, None
        r, ((k, e), *_) = all_w[0]
        return (f"every rank waits inside {_coll(e, by_key.get((k, r), k))}: all entered it, "
                "none completed (a hang inside the collective)"), None
    _, g, e, lag, free, waiters = best
    root = (free or lag)[0]
    who = [r for r in lag if r in free] or lag
    s = (f"{ranks_text(who)} never entered {_coll(e, g)} (step {e.get('step')}); "
         f"{ranks_text(waiters)} {'waits' if len(waiters) == 1 else 'wait'} there")
    f = flights.get(root) or {}
    done = f.get("steps_completed")
    if done is not None and not _waiting(f) and f.get("step", -1) < (e.get("step") or 0):
        s += (f"; rank {root} completed {done} step{'s' if done != 1 else ''} and left its "
              "loop (its data ran out?)")
    st = (summ.get(root) or {}).get("frame")
    if st:
        s += f"; rank {root} is in `{st['func']}` at {st['file']}:{st['line']}"
    return s, root


# the peer address a victim's message names ("[127.0.0.1]:20714"), different on each rank
PEER_ADDRESS = re.compile(r"\[[^\]\s]*\]:\d+|\b\d{1,3}(?:\.\d{1,3}){3}:\d+\b")


def failure_text(d: dict) -> str | None:
    """A failed run's error text from its diagnosis, the cause first: the rank that failed
    first, its words and its traceback; then the other failed ranks, one line per distinct
    message, those that only lost their peer (left[].lost_peer) last and said as such
    ("ranks 0, 2 lost their peer: RuntimeError: ... Connection closed by peer"). None when no
    rank failed (a hang: the sentence says it all)."""
    left, errors = d.get("left") or [], d.get("errors") or {}
    if not left:
        return None
    first = left[0]
    words = first["last_words"] or f"exit code {first['exit_code']}"
    out = [f"rank {first['rank']}: {words}"]
    tb = errors.get(first["rank"], errors.get(str(first["rank"])))
    if tb and tb.strip():  # (its error file's first line is that same "rank N: ..." line)
        tb = tb.strip()
        out = [tb[-20000:]] if _error_line(tb) == first["last_words"] else out + ["", tb[-20000:]]
    causes: dict[str, list[int]] = {}
    lost: dict[str, list[int]] = {}
    for x in left[1:]:
        words = str(x["last_words"] or f"exit code {x['exit_code']}")
        if x.get("lost_peer"):  # each victim names its own peer's address: one line for all
            lost.setdefault(PEER_ADDRESS.sub("[…]", words), []).append(x["rank"])
        else:
            causes.setdefault(words, []).append(x["rank"])
    tail = [f"{ranks_text(rs)}: {w}" for w, rs in causes.items()] + \
        [f"{ranks_text(rs)} lost {'its' if len(rs) == 1 else 'their'} peer: {w}"
         for w, rs in lost.items()]
    return "\n".join(out + ([""] + tail if tail else []))


def write_diagnosis(out_dir, **kw) -> dict:
    """diagnose(out_dir, **kw), also written to OUT/diagnosis.json (tmp + rename)."""
    d = diagnose(out_dir, **kw)
    path = Path(out_dir) / DIAGNOSIS_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(d, default=str))
    os.replace(tmp, path)
    return d
