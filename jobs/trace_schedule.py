"""Bounded tracing (docs/trace-schema.md, "Bounded tracing"): which steps a run traces in
detail, at which level, and how large the trace is predicted to be. Standard library only: the
spec validation, the tracer, the analysis and the new-run form's prediction all use these
definitions.

Schedule (torch.profiler.schedule semantics, `skip_first` = 0): steps cycle through `wait`
skipped steps, `warmup` steps and `active` traced steps, `repeat` times (0 = forever).
Warm-up steps are NOT recorded: the profiler discards its warm-up results, and paralab's tracer
has nothing to warm up, so a warm-up step is simply an untraced step. `active` = 0 (the default)
(the default) with no `steps` list means the default schedule: the first DEFAULT_FIRST steps,
then DEFAULT_ACTIVE in every DEFAULT_PERIOD (the last ones of each period), at most
DEFAULT_MAX_RECORDS detailed records per rank; every step's loss and step time are kept either
way (`scalars`). Tracing every step is one explicit choice, `steps: "all"`. An explicit `steps`
list ("0-2,10,20-21") replaces the schedule. `max_records` caps the detailed records of a rank:
a step starts traced only while fewer than that many were written (a step is never cut in half,
so a rank writes at most `max_records` plus one step's records).
"""

from __future__ import annotations

import math
import re

LEVELS = ("layer", "block", "step", "off")
# levels that write no `mem`, `comm` or `moe` record (`step`: the step span only; `off`: no
# detailed record at all, every step's `scalars` only)
NO_SAMPLES = frozenset({"step", "off"})
_RANGE_RE = re.compile(r"^\s*(\d{1,7})\s*(?:-\s*(\d{1,7})\s*)?$")

# The default schedule (a `trace` section with neither `active` nor `steps`): a short run is
# traced whole, a long one keeps its first steps and a window near the end of every period, so
# its detailed trace grows 20x slower than the run and stops at the record cap. The windows sit
# at the end of a period: by then the step has settled (no warm-up) and the run page's "latest
# step" is never far behind.
DEFAULT_FIRST, DEFAULT_PERIOD, DEFAULT_ACTIVE = 20, 100, 5
DEFAULT_MAX_RECORDS = 500_000
ALL = "all"
assert DEFAULT_FIRST <= DEFAULT_PERIOD - DEFAULT_ACTIVE  # the first steps and the windows
# never overlap: traced_step_count adds them (_cycle)

# Record types the schedule and the cap govern; `meta`, `end`, `scalars`, `instant`,
# `nonfinite` are always written.
DETAIL_TYPES = frozenset({"span", "comm", "mem", "moe"})


def parse_steps(text: str) -> list[int]:
    """'0-2,10' -> [0, 1, 2, 10]; raises ValueError naming the bad part."""
    out: set[int] = set()
    for part in text.split(","):
        m = _RANGE_RE.match(part)
        if not m:
            raise ValueError(f"bad part {part.strip()!r:.40}: use comma-separated steps or "
                             "ranges like '0-2,10'")
        a = int(m.group(1))
        b = int(m.group(2)) if m.group(2) is not None else a
        if b < a:
            raise ValueError(f"range {part.strip()!r:.40} runs backwards")
        if b - a > 1_000_000:
            raise ValueError(f"range {part.strip()!r:.40} is longer than 1000000 steps")
        out.update(range(a, b + 1))
    return sorted(out)


def mode(trace) -> str:
    """"all" (every step: no section, as the benchmarks' tracers have, or `steps: "all"`),
    "steps" (an explicit list), "schedule" (wait / warmup / active / repeat), "default", or
    "off" (`level: off`: no step in detail)."""
    if trace is not None and trace.level == "off":
        return "off"
    if trace is None or trace.steps.strip() == ALL:
        return "all"
    if trace.steps:
        return "steps"
    return "schedule" if trace.active else "default"


def max_records(trace) -> int:
    """The detailed-record cap of a rank (0 = none): the section's, else the default
    schedule's."""
    if trace is None:
        return 0
    if mode(trace) == "off":
        return 0
    if not trace.max_records and mode(trace) == "default":
        return DEFAULT_MAX_RECORDS
    return trace.max_records


def describe(trace) -> str:
    """The schedule in words, as the new-run form and the run page state it."""
    m = mode(trace)
    cap = max_records(trace)
    capped = f", at most {cap:,} detailed records per rank" if cap else ""
    if m == "off":
        return ("off: no detailed records (trace.level = \"off\"); every step's loss and step "
                "time are kept")
    if m == "all":
        return "every step (trace.steps = \"all\")" + capped
    if m == "steps":
        return f"the steps listed in trace.steps{capped}"
    if m == "schedule":
        return (f"wait {trace.wait}, warmup {trace.warmup}, active {trace.active}, "
                f"repeat {trace.repeat or 'until the end'}{capped}")
    return (f"default: the first {DEFAULT_FIRST} steps, then {DEFAULT_ACTIVE} in every "
            f"{DEFAULT_PERIOD}{capped}; every step's loss and step time are kept; "
            "trace.steps = \"all\" traces every step")


def _cycle(trace) -> tuple[int, int, int, int]:
    """(first, off, cycle, repeat) of a schedule: steps [0, first) are traced, then in each
    cycle of `cycle` steps those from `off` on, for `repeat` cycles (0 = until the end). A
    torch.profiler-style schedule has no first steps; the default schedule is the first
    DEFAULT_FIRST steps and the last DEFAULT_ACTIVE of every DEFAULT_PERIOD."""
    if mode(trace) == "default":
        return DEFAULT_FIRST, DEFAULT_PERIOD - DEFAULT_ACTIVE, DEFAULT_PERIOD, 0
    return 0, trace.wait + trace.warmup, trace.wait + trace.warmup + trace.active, trace.repeat


def is_scheduled(trace, step: int) -> bool:
    """Whether `step` is traced in detail by the `trace` spec section (max_records aside)."""
    m = mode(trace)
    if m == "all":
        return True
    if m == "off":
        return False
    if m == "steps":
        return step in _steps_set(trace.steps)
    first, off, cycle, repeat = _cycle(trace)
    if step < first:
        return True
    if repeat and step // cycle >= repeat:
        return False
    return step % cycle >= off


_CACHE: dict[str, frozenset] = {}


def _steps_set(text: str) -> frozenset:
    s = _CACHE.get(text)
    if s is None:
        s = _CACHE[text] = frozenset(parse_steps(text))
    return s


def iter_traced(trace, steps: int, start: int = 0):
    """The scheduled steps of a run of `steps` steps (from `start` when resumed), in order,
    jumping over untraced stretches (a run may have a million steps)."""
    m = mode(trace)
    if m == "off":
        return
    if m == "all":
        yield from range(start, steps)
        return
    if m == "steps":
        yield from (s for s in parse_steps(trace.steps) if start <= s < steps)
        return
    first, off, cycle, repeat = _cycle(trace)
    yield from range(start, min(first, steps))
    end = min(steps, repeat * cycle) if repeat else steps
    base = start - start % cycle
    while base < end:
        yield from range(max(base + off, start, first), min(base + cycle, end))
        base += cycle


def traced_steps(trace, steps: int, start: int = 0) -> list[int]:
    return list(iter_traced(trace, steps, start))


def traced_step_count(trace, steps: int, start: int = 0) -> int:
    """len(traced_steps(...)) in closed form."""
    m = mode(trace)
    if m == "off":
        return 0
    if m == "all":
        return max(0, steps - start)
    if m == "steps":
        return sum(1 for s in parse_steps(trace.steps) if start <= s < steps)
    first, off, cycle, repeat = _cycle(trace)

    def upto(n: int) -> int:  # traced steps in [0, n): the first ones, then the windows
        w = min(n, repeat * cycle) if repeat else n
        return min(n, first) + w // cycle * (cycle - off) + max(0, w % cycle - off)
    return upto(steps) - upto(min(start, steps))


def compact_ranges(steps) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2,5,7-8' (what the analysis and the run page show)."""
    out, run = [], None
    for s in sorted(set(steps)):
        if run and s == run[1] + 1:
            run[1] = s
            continue
        if run:
            out.append(str(run[0]) if run[0] == run[1] else f"{run[0]}-{run[1]}")
        run = [s, s]
    if run:
        out.append(str(run[0]) if run[0] == run[1] else f"{run[0]}-{run[1]}")
    return ",".join(out)


def keeps_span(level: str, name: str, cat: str) -> bool:
    """Whether a span is written at `level` on a traced step: `layer` everything; `block`
    everything but the per-layer spans (`forward.layer`, `backward.layer`, `cp.step`); `step`
    only the `step` span."""
    if level == "layer":
        return True
    if level == "off":
        return False
    if level == "step":
        return cat == "step"
    return not (name.endswith(".layer") or name == "cp.step")


# Mean encoded size of a record (bytes, one JSON line), measured on tiny reference runs
# (tests/jobs/test_trace_schedule.py prints the measured means); an estimate, unlike the counts.
BYTES_PER_RECORD = {"span": 140, "mem": 195, "comm": 270, "scalars": 230, "meta": 1500,
                    "end": 140}


def records_per_traced_step(spec) -> dict:
    """Detailed records one rank writes per traced step, by type, from the spec.

    Exact for span and mem records with the direct runner (pp = 1, cp = 1, no MoE): per
    micro-batch round `forward`, `backward`, one `after_forward` sample and, at level `layer`,
    one `forward.layer` and one `backward.layer` span per layer (two `forward.layer` with
    activation checkpointing: the recompute); per step `step`, `grad_sync`, `optimizer`,
    `wait_grads` (bucketed DDP / ZeRO-1/2 on the reference engine) and the `after_backward` /
    `after_step` samples. Collectives depend on bucketing and parameter tensors: `comm` is None
    (not predicted) except at level `step`, which writes none. Pipelines, CP and MoE: None."""
    t, p, m = spec.trace, spec.parallel, spec.model
    if t.level == "off":
        return {"span": 0, "mem": 0, "comm": 0, "exact": True}
    if t.level == "step":
        return {"span": 1, "mem": 0, "comm": 0, "exact": True}
    if p.pp > 1 or p.cp > 1 or m.experts:
        return {"span": None, "mem": None, "comm": None, "exact": False}
    rounds = spec.train.grad_accum * p.microbatches
    per_round = 2 + (m.layers * (3 if spec.train.activation_checkpointing else 2)
                     if t.level == "layer" else 0)
    bucketed = p.engine == "reference" and (
        (p.zero_stage == 0 and p.dp_mode == "ddp") or p.zero_stage in (1, 2))
    spans = rounds * per_round + 3 + (1 if bucketed else 0)
    return {"span": spans, "mem": rounds + 2, "comm": None, "exact": False}


def predicted_trace(spec) -> dict:
    """The new-run form's trace size: traced steps, records and bytes per rank and in all.
    `records` counts the predicted span / mem (and, where known, comm) records, one
    `scalars` record per step and the fixed ones (`meta`, `end`, and the `init` memory sample
    but at level `step`); where `comm` is not predicted the figures are lower bounds."""
    start = spec.resume.step if spec.resume.run_id else 0
    n = spec.train.steps - start
    per = records_per_traced_step(spec)
    known = {k: v for k, v in per.items() if k in ("span", "mem", "comm") and v is not None}
    per_step = sum(known.values()) if per["span"] is not None else None
    nt = traced_step_count(spec.trace, spec.train.steps, start)
    cap = max_records(spec.trace)
    if per_step is not None and cap:
        # whole steps start while fewer than max_records were written
        nt = min(nt, math.ceil(cap / per_step) if per_step else nt)
    init = 0 if spec.trace.level in NO_SAMPLES else 1
    rec = (per_step or 0) * nt + n + 2 + init
    size = sum(BYTES_PER_RECORD[k] * v * nt for k, v in known.items()) \
        + BYTES_PER_RECORD["scalars"] * n + BYTES_PER_RECORD["meta"] + BYTES_PER_RECORD["end"] \
        + BYTES_PER_RECORD["mem"] * init
    world = spec.world_size
    shown = []
    for s in iter_traced(spec.trace, spec.train.steps, start):
        if len(shown) >= min(nt, 1000):
            break
        shown.append(s)
    ranges = compact_ranges(shown) + (",…" if nt > len(shown) else "")
    return {"traced_steps": ranges, "traced_step_count": nt,
            "schedule": describe(spec.trace), "max_records": cap,
            "steps": n, "level": spec.trace.level,
            "records_per_traced_step": per_step, "by_type": per,
            "lower_bound": per["comm"] is None,
            "records_per_rank": rec, "bytes_per_rank": size,
            "records": rec * world, "bytes": size * world,
            "rule": ("span + mem records exact for the direct runner; collectives not "
                     "predicted (a lower bound)" if per["comm"] is None
                     else "exact: one step span per traced step, one scalars per step")}


def trace_checks(spec) -> list[dict]:
    """Cross-field rules of the `trace` section, as jobs.spec errors ({loc, msg, type})."""
    t, e = spec.trace, []

    def err(field: str | None, msg: str) -> None:
        e.append({"loc": ["trace", field] if field else ["trace"], "msg": msg,
                  "type": "value_error"})

    default = type(t)()
    if spec.kind not in ("train", "script") and t != default:
        err(None, "bounded tracing applies to train jobs only (and script jobs)")
        return e
    if t.level == "off" and (t.active or t.steps):
        err("level", "\"off\" traces no step in detail: leave trace.active and trace.steps "
            "unset")
    elif t.steps.strip() == ALL:
        if t.active:
            err("steps", "\"all\" traces every step: leave the schedule (active) unset")
    elif t.steps:
        if t.active:
            err("steps", "give either an explicit steps list or a schedule (active > 0), "
                "not both")
        try:
            listed = parse_steps(t.steps)
        except ValueError as exc:
            err("steps", str(exc))
        else:
            if spec.kind == "train" and listed[-1] >= spec.train.steps:
                err("steps", f"step {listed[-1]} is beyond the run (train.steps = "
                    f"{spec.train.steps}; steps count from 0)")
    elif not t.active:
        for name in ("wait", "warmup", "repeat"):
            if getattr(t, name):
                err(name, "needs a schedule: set trace.active > 0")
    return e
