"""Pipeline schedules as plain data, and a dependency-driven simulator of them (no torch).

The same per-rank action order drives the real pipeline runtime (jobs/parallel/pipeline) and the
theory model (jobs/theory), so a measured timeline and the ideal one differ only by what the
ranks really did.

Stable public API (names and shapes are a contract; extend, do not rename):

    SCHEDULES = ("naive", "gpipe", "1f1b", "interleaved", "zero-bubble", "zbv")
    SPLIT_BACKWARD = ("zero-bubble", "zbv")      schedules whose backward is B + W (no BW)
    PLACEMENTS = ("loop", "v")

    Action(kind, mb, chunk, stage)               NamedTuple
        kind   "F"  forward
               "BW" full backward (input- and weight-gradient together)
               "B"  backward, input gradient only   (zero-bubble, zbv)
               "W"  backward, weight gradient only  (zero-bubble, zbv; needs the B of the same mb)
        mb     micro-batch id, 0 <= mb < m
        chunk  model chunk on this rank, 0 <= chunk < v (always 0 unless interleaved or zbv);
               chunk = stage // p in every placement
        stage  global model stage = stage_of(rank, chunk, p, v, placement_of(schedule)),
               0 <= stage < p * v; data flows stage 0 -> p*v-1 forward and back in reverse.
               `str(a)` is e.g. "F3" or "BW3c1".

    placement_of(schedule) -> "loop" | "v"
        how global stages sit on ranks: "v" for zbv, "loop" for every other schedule.
    stage_of(rank, chunk, p, v=1, placement="loop") -> int
        loop: chunk * p + rank (Megatron / torch interleaved; v = 1 gives stage = rank).
        v:    chunk * p + rank for even chunks, chunk * p + p-1-rank for odd ones (torch's
              generate_stage_to_rank_mapping(style="v")); with v = 2 rank r holds stages r and
              2p-1-r, so stages p-1 and p are both on rank p-1 and rank 0 holds the first and
              the last stage.
    rank_of(stage, p, v=1, placement="loop") -> int
        the pipeline rank that runs `stage` (the inverse of stage_of).

    schedule_actions(schedule, p, m, v=1) -> list[list[Action]]
        the ordered actions of every pipeline rank (index = pipeline rank). A rank runs its list
        in order; an action waits for its dependencies (see `dependencies`).

    check(schedule, p, m, v=1) -> None
        raises ScheduleError (a ValueError with `field`: the argument the broken rule is about)
        unless the configuration is accepted; every function below that takes a schedule
        checks it the same way.

    dependencies(action, p, v) -> list[Action]
        what must have finished first: F(s) <- F(s-1); last stage's B/BW <- its own F;
        B/BW(s) <- B/BW(s+1) and its own F(s); W(s) <- B(s). Placement-free (global stages).

    simulate(schedule, p, m, v=1, t_f=1.0, t_b_input=1.0, t_b_weight=1.0, t_comm=0.0) -> dict
        event simulation of that order. Times are per model stage (one chunk of one rank) in
        seconds: a float, or a list of p*v floats indexed by global stage. A "BW" takes
        t_b_input + t_b_weight. `t_comm` is added to every dependency that crosses ranks. Returns
        a JSON-ready dict:
        {"schedule", "p", "m", "v", "times": {...}, "makespan_s",
         "ranks": [{"rank", "spans": [{"kind", "mb", "chunk", "stage", "start", "end"}, ...],
                    "busy_s", "idle_s", "idle_fraction", "idle_over_busy",
                    "bubble": {"inherent_s", "comm_s"}, "peak_inflight_chunks",
                    "peak_inflight_microbatches"}, ...],
         "bubble_fraction", "bubble_over_ideal", "closed_form": {...} | None, "convention"}
        idle_fraction = idle / makespan (bubble over total time); idle_over_busy = idle / busy
        (bubble over ideal time, the (p-1)/m convention). bubble.inherent_s is the idle time of
        the same order and stage times with t_comm = 0; comm_s is what communication adds.
        bubble_fraction / bubble_over_ideal are the means over ranks.

    closed_form_bubble(schedule, p, m, v=1, convention="total") -> float | None
        (p-1)/(v*m+p-1) over total time, or (p-1)/(v*m) over ideal time, for gpipe / 1f1b /
        interleaved with equal stage times (v = 1 except interleaved); (p-1)/p for naive
        ((p-1) over ideal); None for zero-bubble and zbv (take it from `simulate`).

    explore(schedule, p, m, v=1) -> dict
        the pure schedule: `simulate` with unit times (t_f = t_b_input = t_b_weight = 1) plus
        the action lists as strings, for the dashboard's schedule explorer.

Schedules (every rank r of p):
    naive        no micro-batching overlap: F_j then BW_j for each micro-batch in turn.
    gpipe        all forwards F_0..F_{m-1}, then all backwards BW_0..BW_{m-1} (FIFO order, as
                 torch.distributed.pipelining's ScheduleGPipe; seed 002 draws them reversed, which
                 has the same bubble with equal stage times).
    1f1b         for x = 0 .. m+p-2: F_x (if x < m), then BW_{x-(p-1-r)} (if 0 <= it < m):
                 p-1-r warm-up forwards, steady (F, BW) pairs, p-1-r cool-down backwards
                 (Megatron's forward_backward_pipelining_without_interleaving).
    interleaved  Megatron's interleaved 1F1B: m must be a multiple of p; rank r holds chunks
                 c = 0..v-1 (global stages c*p + r). Warm-up (p-r-1)*2 + (v-1)*p forwards
                 (capped at m*v), then (F, BW) pairs, then cool-down backwards; virtual micro-batch
                 k runs chunk (k mod pv) div p (reversed for backward) of micro-batch
                 (k div pv)*p + k mod p.
    zero-bubble  ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism"): for x = 0 .. m+p-2:
                 F_x, B_{x-(p-1-r)}, W_{x-(p-1)} (each if in range). Same warm-up and peak
                 activation memory as 1F1B (<= p micro-batches in flight); W fills the cool-down.
    zbv          ZB-V (Qi et al. 2023, section 6): the per-rank order of
                 torch.distributed.pipelining's ScheduleZBVZeroBubble (its I = our B). v must be
                 2, V placement (rank r holds stages r and 2p-1-r, chunks 0 and 1). With
                 n = max(m, 2p-1): warm-up 2(p-r)-1 chunk-0 forwards, r (F chunk 1, F chunk 0)
                 pairs, p-r (F, B, W) of chunk 1; steady (F, B, W) on chunk 0 then on chunk 1
                 until both chunks have run n forwards; cool-down r (B chunk 0, B chunk 1) pairs,
                 p-r (B, W) of chunk 0, then the chunk-1 Ws, then the chunk-0 Ws; actions of
                 micro-batches >= m are dropped (torch's bubbles). Activation memory of 1F1B's
                 busiest rank: once m >= 2p-1 every rank peaks at 2p chunks (p micro-batches of
                 its half-size chunks). With t_F = t_B = t_W (per chunk) only the start-up
                 staggering idles, (p-1) t_F per rank: below ZB-H1 at the same p and m.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

SCHEDULES = ("naive", "gpipe", "1f1b", "interleaved", "zero-bubble", "zbv")
SPLIT_BACKWARD = ("zero-bubble", "zbv")
PLACEMENTS = ("loop", "v")
KINDS = ("F", "B", "W", "BW")

CONVENTION = (
    "bubble_fraction = idle / makespan (bubble over total time; closed form (p-1)/(v*m+p-1)); "
    "bubble_over_ideal = idle / busy (bubble over ideal time; closed form (p-1)/(v*m), the seeds' "
    "(p-1)/m). Times are per model stage (one chunk of one rank)."
)


class Action(NamedTuple):
    kind: str  # "F" | "B" | "W" | "BW"
    mb: int
    chunk: int = 0
    stage: int = 0

    def __str__(self) -> str:
        return f"{self.kind}{self.mb}" + (f"c{self.chunk}" if self.chunk else "")

    def as_dict(self) -> dict:
        return self._asdict()


class ScheduleError(ValueError):
    """A configuration the schedules refuse; `field` names the argument the rule is about
    ("schedule", "p", "m", "v", "t_f", "t_b_input", "t_b_weight" or "t_comm")."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def check(schedule: str, p: int, m: int, v: int = 1) -> None:
    """Raise ScheduleError unless (schedule, p, m, v) is a configuration the schedules accept."""
    if schedule not in SCHEDULES:
        raise ScheduleError("schedule", f"schedule must be one of {', '.join(SCHEDULES)}, "
                                        f"got {schedule!r}")
    for name, val in (("p", p), ("m", m), ("v", v)):
        if isinstance(val, bool) or not isinstance(val, int) or val < 1:
            raise ScheduleError(name, f"{name} must be an integer >= 1, got {val!r}")
    if schedule == "zbv":
        if v != 2:
            raise ScheduleError("v", "zbv needs v = 2 (two model chunks per rank in a V), "
                                     f"got v = {v}")
    elif v > 1 and schedule != "interleaved":
        raise ScheduleError("v", f"v must be 1 unless the schedule is 'interleaved' (got v = {v})")
    if schedule == "interleaved" and m % p:
        raise ScheduleError("m", f"interleaved needs m to be a multiple of p (m = {m}, p = {p})")


def placement_of(schedule: str) -> str:
    """How `schedule` lays global stages on ranks: "v" for zbv, "loop" otherwise."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    return "v" if schedule == "zbv" else "loop"


def _check_place(p: int, v: int, placement: str) -> None:
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {', '.join(PLACEMENTS)}, got {placement!r}")
    if p < 1 or v < 1:
        raise ValueError(f"p and v must be >= 1, got p = {p}, v = {v}")


def stage_of(rank: int, chunk: int, p: int, v: int = 1, placement: str = "loop") -> int:
    """Global model stage of `chunk` on pipeline `rank` (see module docstring)."""
    _check_place(p, v, placement)
    if not (0 <= rank < p and 0 <= chunk < v):
        raise ValueError(f"need 0 <= rank < p = {p} and 0 <= chunk < v = {v}, "
                         f"got rank {rank}, chunk {chunk}")
    if placement == "v" and chunk % 2:
        return chunk * p + p - 1 - rank
    return chunk * p + rank


def rank_of(stage: int, p: int, v: int = 1, placement: str = "loop") -> int:
    """The pipeline rank that runs global `stage` (inverse of `stage_of`)."""
    _check_place(p, v, placement)
    if not 0 <= stage < p * v:
        raise ValueError(f"need 0 <= stage < p*v = {p * v}, got {stage}")
    chunk, pos = divmod(stage, p)
    return p - 1 - pos if placement == "v" and chunk % 2 else pos


def _one_f_one_b(p: int, m: int, r: int, split: bool) -> list[Action]:
    out: list[Action] = []
    # Only the clock ticks where this rank has work (F in [0, m), B from p-1-r, W from p-1):
    # O(m) per rank instead of O(m + p), which made p = 4096 cost 9 s.
    ticks = sorted({*range(m), *range(p - 1 - r, p - 1 - r + m),
                    *(range(p - 1, p - 1 + m) if split else ())})
    for x in ticks:
        if x < m:
            out.append(Action("F", x, 0, r))
        b = x - (p - 1 - r)
        if 0 <= b < m:
            out.append(Action("B" if split else "BW", b, 0, r))
        w = x - (p - 1)
        if split and 0 <= w < m:
            out.append(Action("W", w, 0, r))
    return out


def _interleaved(p: int, m: int, v: int, r: int) -> list[Action]:
    total = m * v

    def virt(k: int, forward: bool) -> Action:
        c = (k % (p * v)) // p
        if not forward:
            c = v - 1 - c
        mb = (k // (p * v)) * p + k % p
        return Action("F" if forward else "BW", mb, c, c * p + r)

    warm = min((p - r - 1) * 2 + (v - 1) * p, total)
    out = [virt(k, True) for k in range(warm)]
    for i in range(total - warm):
        out.append(virt(warm + i, True))
        out.append(virt(i, False))
    out += [virt(k, False) for k in range(total - warm, total)]
    return out


def _zbv(p: int, m: int, r: int) -> list[Action]:
    """torch.distributed.pipelining.ScheduleZBVZeroBubble._calculate_single_rank_operations,
    torch-free (I -> "B"); rank r runs stages r (chunk 0) and 2p-1-r (chunk 1)."""
    n = max(2 * p - 1, m)  # torch pads to 2p-1 micro-batches, then drops the extra actions
    stage = (r, 2 * p - 1 - r)
    out: list[Action] = []
    cnt = {"f0": 0, "f1": 0, "b0": 0, "b1": 0}

    def add(kind: str, chunk: int, key: str | None = None, mb: int | None = None) -> None:
        if mb is None:
            mb = cnt[key]
            cnt[key] += 1
        out.append(Action(kind, mb, chunk, stage[chunk]))

    def fbw(chunk: int) -> None:  # B and W of the same (next) micro-batch
        b = f"b{chunk}"
        add("B", chunk, mb=cnt[b])
        add("W", chunk, b)

    for _ in range(2 * (p - r) - 1):  # warm-up
        add("F", 0, "f0")
    for _ in range(r):
        add("F", 1, "f1")
        add("F", 0, "f0")
    for _ in range(p - r):
        add("F", 1, "f1")
        fbw(1)
    while cnt["f1"] < cnt["f0"] or cnt["f0"] < n:  # steady
        if cnt["f0"] < n:
            add("F", 0, "f0")
        fbw(0)
        add("F", 1, "f1")
        fbw(1)
    w0, w1 = cnt["b0"], cnt["b1"]  # cool-down
    for _ in range(r):
        add("B", 0, "b0")
        add("B", 1, "b1")
    for _ in range(p - r):
        add("B", 0, "b0")
        add("W", 0, mb=w0)
        w0 += 1
    out += [Action("W", j, 1, stage[1]) for j in range(w1, cnt["b1"])]
    out += [Action("W", j, 0, stage[0]) for j in range(w0, cnt["b0"])]
    return [a for a in out if a.mb < m]


def schedule_actions(schedule: str, p: int, m: int, v: int = 1) -> list[list[Action]]:
    """Per pipeline rank, the ordered actions of one optimizer step (see module docstring)."""
    check(schedule, p, m, v)
    ranks = []
    for r in range(p):
        if schedule == "naive":
            acts = [a for j in range(m) for a in (Action("F", j, 0, r), Action("BW", j, 0, r))]
        elif schedule == "gpipe":
            acts = [Action("F", j, 0, r) for j in range(m)] + \
                   [Action("BW", j, 0, r) for j in range(m)]
        elif schedule == "1f1b":
            acts = _one_f_one_b(p, m, r, split=False)
        elif schedule == "zero-bubble":
            acts = _one_f_one_b(p, m, r, split=True)
        elif schedule == "zbv":
            acts = _zbv(p, m, r)
        else:
            acts = _interleaved(p, m, v, r)
        ranks.append(acts)
    return ranks


@functools.lru_cache(maxsize=4096)
def cached_actions(schedule: str, p: int, m: int, v: int = 1) -> tuple[tuple[Action, ...], ...]:
    """schedule_actions as immutable tuples, memoised: the theory (jobs/theory/advisor.py) asks
    for the same few schedules thousands of times."""
    return tuple(tuple(acts) for acts in schedule_actions(schedule, p, m, v))


def _act(kind: str, mb: int, stage: int, p: int) -> Action:
    return Action(kind, mb, stage // p, stage)


def dependencies(action: Action, p: int, v: int = 1, split: bool | None = None) -> list[Action]:
    """Actions that must finish before `action` may start. `split` says whether backwards are
    B+W (zero-bubble) rather than BW; by default it follows the action's own kind."""
    kind, mb, s = action.kind, action.mb, action.stage
    last = p * v - 1
    if split is None:
        split = kind in ("B", "W")
    back = "B" if split else "BW"
    if kind == "F":
        return [_act("F", mb, s - 1, p)] if s > 0 else []
    if kind in ("B", "BW"):
        deps = [_act("F", mb, s, p)]
        if s < last:
            deps.append(_act(back, mb, s + 1, p))
        return deps
    if kind == "W":
        return [_act("B", mb, s, p)]
    raise ValueError(f"unknown action kind {kind!r}")


def _per_stage(name: str, val, n: int) -> list[float]:
    if isinstance(val, (int, float)) and not isinstance(val, bool):
        vals = [float(val)] * n
    else:
        vals = [float(x) for x in val]
        if len(vals) != n:
            raise ScheduleError(name, f"{name} must be a number or a list of p*v = {n} numbers")
    if any(x < 0 for x in vals):
        raise ScheduleError(name, f"{name} must be >= 0")
    return vals


def _run(actions, p, v, tf, tb, tw, t_comm, placement="loop"):
    """Start/end of every action; ranks run their lists in order."""
    home = [rank_of(s, p, v, placement) for s in range(p * v)]
    dur = {"F": tf, "B": tb, "W": tw, "BW": [b + w for b, w in zip(tb, tw, strict=True)]}
    end: dict[Action, float] = {}
    free = [0.0] * p
    nxt = [0] * p
    spans: list[list[tuple[Action, float, float]]] = [[] for _ in range(p)]
    remaining = sum(len(a) for a in actions)
    sweep = 0
    while remaining:
        progress = False
        # Forward work flows up the ranks and backward work down: sweeping in alternate
        # directions lets each sweep carry a whole wave, so a p-stage pipeline takes O(m)
        # sweeps instead of O(p) (p = 2048 took 9 s). Times do not depend on the order: a
        # rank runs its list in order, each action starting at max(rank free, inputs ready).
        order = range(p) if sweep % 2 == 0 else range(p - 1, -1, -1)
        sweep += 1
        for r in order:
            while nxt[r] < len(actions[r]):
                a = actions[r][nxt[r]]
                ready = free[r]
                ok = True
                for d in dependencies(a, p, v, split=(a.kind in ("B", "W"))):
                    if d not in end:
                        ok = False
                        break
                    ready = max(ready, end[d] + (t_comm if home[d.stage] != r else 0.0))
                if not ok:
                    break
                e = ready + dur[a.kind][a.stage]
                end[a] = e
                free[r] = e
                spans[r].append((a, ready, e))
                nxt[r] += 1
                remaining -= 1
                progress = True
        if not progress:
            stuck = {r: str(actions[r][nxt[r]]) for r in range(p) if nxt[r] < len(actions[r])}
            raise RuntimeError(f"schedule deadlocks; next actions per rank: {stuck}")
    return spans


def _inflight(acts: list[Action]) -> int:
    live = peak = 0
    for a in acts:
        if a.kind == "F":
            live += 1
            peak = max(peak, live)
        elif a.kind in ("BW", "W"):
            live -= 1
    return peak


def closed_form_bubble(schedule: str, p: int, m: int, v: int = 1,
                       convention: str = "total") -> float | None:
    """The textbook bubble with equal stage times; None where there is no closed form here."""
    if convention not in ("total", "ideal"):
        raise ValueError("convention must be 'total' or 'ideal'")
    check(schedule, p, m, v)
    if schedule in SPLIT_BACKWARD:
        return None
    if schedule == "naive":
        # every micro-batch crosses the whole pipeline alone: busy 1/p of the time
        return (p - 1) / p if convention == "total" else float(p - 1)
    if convention == "total":
        return (p - 1) / (v * m + p - 1)
    return (p - 1) / (v * m)


def simulate(schedule: str, p: int, m: int, v: int = 1, t_f=1.0, t_b_input=1.0,
             t_b_weight=1.0, t_comm: float = 0.0) -> dict:
    """Ideal timeline of `schedule_actions(schedule, p, m, v)` (see module docstring)."""
    actions = cached_actions(schedule, p, m, v)
    n = p * v
    tf = _per_stage("t_f", t_f, n)
    tb = _per_stage("t_b_input", t_b_input, n)
    tw = _per_stage("t_b_weight", t_b_weight, n)
    if t_comm < 0:
        raise ScheduleError("t_comm", "t_comm must be >= 0")
    place = placement_of(schedule)
    spans = _run(actions, p, v, tf, tb, tw, float(t_comm), place)
    base = spans if t_comm == 0 else _run(actions, p, v, tf, tb, tw, 0.0, place)
    makespan = max((s[-1][2] for s in spans if s), default=0.0)
    base_makespan = max((s[-1][2] for s in base if s), default=0.0)
    ranks = []
    for r in range(p):
        busy = sum(e - s for _, s, e in spans[r])
        idle = makespan - busy
        inherent = base_makespan - busy
        peak = _inflight(actions[r])
        ranks.append({
            "rank": r,
            "spans": [{"kind": a.kind, "mb": a.mb, "chunk": a.chunk, "stage": a.stage,
                       "start": s, "end": e} for a, s, e in spans[r]],
            "busy_s": busy,
            "idle_s": idle,
            "idle_fraction": idle / makespan if makespan > 0 else 0.0,
            "idle_over_busy": idle / busy if busy > 0 else 0.0,
            "bubble": {"inherent_s": inherent, "comm_s": idle - inherent},
            "peak_inflight_chunks": peak,
            "peak_inflight_microbatches": peak / v,
        })
    uniform = len(set(tf)) == 1 and len(set(tb)) == 1 and len(set(tw)) == 1 and t_comm == 0
    closed = None
    if uniform and schedule not in SPLIT_BACKWARD:
        closed = {"total": closed_form_bubble(schedule, p, m, v, "total"),
                  "ideal": closed_form_bubble(schedule, p, m, v, "ideal"),
                  "formula_total": "(p-1)/p" if schedule == "naive" else "(p-1)/(v*m+p-1)",
                  "formula_ideal": "p-1" if schedule == "naive" else "(p-1)/(v*m)"}
    return {
        "schedule": schedule, "p": p, "m": m, "v": v,
        "times": {"t_f": tf, "t_b_input": tb, "t_b_weight": tw, "t_comm": float(t_comm),
                  "unit": "s per model stage"},
        "makespan_s": makespan,
        "ranks": ranks,
        "bubble_fraction": sum(x["idle_fraction"] for x in ranks) / p,
        "bubble_over_ideal": sum(x["idle_over_busy"] for x in ranks) / p,
        "closed_form": closed,
        "convention": CONVENTION,
    }


def explore(schedule: str, p: int, m: int, v: int = 1) -> dict:
    """The pure schedule of one configuration, in unit times, for the schedule explorer."""
    out = simulate(schedule, p, m, v)
    out["actions"] = [[str(a) for a in acts] for acts in schedule_actions(schedule, p, m, v)]
    return out
