"""The `faults` list of a job spec: faults injected on purpose, to learn what a broken run looks
like and to test paralab's diagnosis of it (docs/faults.md). Standard library only, like
jobs/spec.py, which parses the list with `parse_faults` (errors name `faults.<i>.<field>`).

Each fault fires on the ranks it names, at one step (and, for collective faults, at the first
matching collective of that step on that rank), on the restart attempt it names (0: the first
run only, so an automatic restart from a checkpoint gets past it).

    kind             what the rank does                                 fields it reads
    crash            raises (mode "exception") or exits hard ("exit")    step, mode, exit_code
    hang             blocks at the entry of a collective, forever: it   step, op, group
                     never enters it, its peers wait inside theirs
    skip_collective  does not issue one collective the others issue    step, op, group
                     (no trace record either, as a real bug leaves none)
    mismatch         issues a different op ("op": all_reduce becomes    step, op, group, mode
                     broadcast, others all_reduce) or size ("size": half
                     the elements) to torch.distributed
    slow             sleeps delay_s before a collective ("comm") or in  step, delay_s, mode,
                     its compute ("compute"): the seed's late rank       op, group, steps
    data_exhausted   its data ends after `step` steps (it stops early)  step
    nonfinite        its loss, hence its gradients, become NaN / Inf    step, mode
                     (the model output is multiplied by NaN / Inf); every
                     rank checks its local loss and parameters after each
                     step and fails the run naming the step

skip_collective and mismatch target collectives (not send / recv); the native engine takes
crash, data_exhausted, nonfinite and slow (compute) only (`native_refusal`). Injection:
jobs/faults.py; what paralab shows for each: docs/faults.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

FAULT_KINDS = ("crash", "hang", "skip_collective", "mismatch", "slow", "data_exhausted",
               "nonfinite")
# the collectives a fault can target (as the tracer names them); "" = the first of any op
FAULT_OPS = ("", "all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "gather",
             "scatter", "send", "recv", "barrier", "all_to_all")
FAULT_GROUPS = ("", "dp", "tp", "pp")  # "" = any group
MODES = {"crash": ("exception", "exit"), "mismatch": ("size", "op"),
         "slow": ("comm", "compute"), "nonfinite": ("nan", "inf")}
DEFAULT_MODE = {k: v[0] for k, v in MODES.items()}
COMM_KINDS = ("hang", "skip_collective", "mismatch")
MAX_FAULTS = 16


@dataclass(frozen=True)
class FaultSpec:
    kind: str = field(default="crash", metadata={
        "doc": "what goes wrong", "choices": FAULT_KINDS})
    ranks: tuple = field(default=(0,), metadata={"doc": "global ranks it happens on"})
    step: int = field(default=0, metadata={
        "doc": "the step it happens at (data_exhausted: steps of data the rank has)",
        "ge": 0, "le": 1_000_000})
    steps: int = field(default=1, metadata={
        "doc": "slow: for how many consecutive steps", "ge": 1, "le": 1_000_000})
    op: str = field(default="", metadata={
        "doc": "collective it targets ('' = the step's first collective)", "choices": FAULT_OPS,
        "empty_ok": True})
    group: str = field(default="", metadata={
        "doc": "process group axis it targets ('' = any)", "choices": FAULT_GROUPS,
        "empty_ok": True})
    mode: str = field(default="", metadata={
        "doc": "crash: exception | exit; mismatch: size | op; slow: comm | compute; "
               "nonfinite: nan | inf ('' = the first)", "empty_ok": True})
    delay_s: float = field(default=1.0, metadata={
        "doc": "slow: seconds of delay", "ge": 0.0, "le": 3600.0})
    exit_code: int = field(default=3, metadata={
        "doc": "crash mode exit: the process's exit code", "ge": 1, "le": 255})
    attempt: int = field(default=0, metadata={
        "doc": "restart attempt it fires on (0 = the first; -1 = every attempt)",
        "ge": -1, "le": 100})

    @property
    def resolved_mode(self) -> str:
        return self.mode or DEFAULT_MODE.get(self.kind, "")

    def fires(self, rank: int, attempt: int) -> bool:
        return rank in self.ranks and self.attempt in (-1, attempt)

    def describe(self) -> str:
        """One line for the run page and compare: 'slow (comm) on rank 1 at step 2, 0.5 s'."""
        ranks = ", ".join(map(str, self.ranks))
        what = self.kind + (f" ({self.resolved_mode})" if self.resolved_mode else "")
        where = f" {self.op or 'collective'}" + (f" of group {self.group}" if self.group else "")
        s = f"{what} on rank{'s' if len(self.ranks) > 1 else ''} {ranks} at step {self.step}"
        if self.kind in COMM_KINDS or (self.kind == "slow" and self.resolved_mode == "comm"):
            s += f", before{where}" if self.kind == "slow" else f", at{where}"
        if self.kind == "slow":
            s += f", {self.delay_s:g} s" + (f" for {self.steps} steps" if self.steps > 1 else "")
        if self.kind == "data_exhausted":
            s = f"data_exhausted on rank{'s' if len(self.ranks) > 1 else ''} {ranks}: " \
                f"its data ends after {self.step} steps"
        return s


def _err(loc, msg, typ="value_error"):
    return {"loc": list(loc), "msg": msg, "type": typ}


def parse_faults(value, check_scalar, errors: list) -> tuple:
    """The `faults` list -> tuple of FaultSpec; problems go to `errors` (jobs/spec.py's shape).
    `check_scalar(value, ftype, loc, meta, errors)` is spec.py's one scalar rule."""
    if not isinstance(value, list):
        errors.append(_err(("faults",), "must be a list of fault objects", "list_type"))
        return ()
    if len(value) > MAX_FAULTS:
        errors.append(_err(("faults",), f"at most {MAX_FAULTS} faults", "too_long"))
        return ()
    fields = FaultSpec.__dataclass_fields__
    out = []
    for i, item in enumerate(value):
        loc = ("faults", i)
        if not isinstance(item, dict):
            errors.append(_err(loc, "must be an object", "dict_type"))
            continue
        n0 = len(errors)
        for key in item:
            if key not in fields:
                errors.append(_err((*loc, key), f"unknown field; allowed: {', '.join(fields)}",
                                   "extra_forbidden"))
        kwargs = {}
        for name, f in fields.items():
            if name not in item:
                continue
            v = item[name]
            if name == "ranks":
                if (not isinstance(v, list) or not v or len(v) > 4096
                        or not all(type(r) is int and r >= 0 for r in v)):
                    errors.append(_err((*loc, name), "must be a non-empty list of rank "
                                       "numbers (integers >= 0)", "list_type"))
                    continue
                kwargs[name] = tuple(sorted(set(v)))
                continue
            ftype = f.type if isinstance(f.type, str) else f.type.__name__
            parsed = check_scalar(v, ftype, (*loc, name), f.metadata, errors)
            if parsed is not None:
                kwargs[name] = parsed
        if len(errors) > n0:
            continue
        fault = FaultSpec(**kwargs)
        modes = MODES.get(fault.kind, ())
        if fault.mode and fault.mode not in modes:
            errors.append(_err((*loc, "mode"), f"for kind {fault.kind!r} must be one of "
                               f"{', '.join(modes)}" if modes else
                               f"kind {fault.kind!r} takes no mode", "enum"))
            continue
        if not math.isfinite(fault.delay_s):  # pragma: no cover - check_scalar refuses it
            errors.append(_err((*loc, "delay_s"), "must be finite"))
            continue
        out.append(fault)
    return tuple(out)


# what the native engine (torch DDP / FSDP2 / DTensor) can take: its collectives are issued
# from C++ or recorded after the fact, so the collective faults cannot intercept them
NATIVE_KINDS = ("crash", "data_exhausted", "nonfinite", "slow")


def native_refusal(f: FaultSpec) -> str | None:
    """Why engine native cannot inject `f` (None: it can)."""
    if f.kind not in NATIVE_KINDS or (f.kind == "slow" and f.resolved_mode == "comm"):
        return (f"{f.kind}{' (comm)' if f.kind == 'slow' else ''} needs the reference engine: "
                "it intercepts collectives the native engine issues from C++ (DDP) or records "
                "after the fact (DTensor); native takes crash, data_exhausted, nonfinite and "
                "slow (compute)")
    return None


def fault_cross_checks(faults: tuple, world: int, steps: int,
                       engine: str | None = None) -> list[dict]:
    """Rules that need the rest of the spec: ranks inside the world, steps inside the run,
    and (given `engine`) the kinds the native engine can take."""
    e = []
    for i, f in enumerate(faults):
        why = native_refusal(f) if engine == "native" else None
        if why:
            e.append(_err(("faults", i, "kind"), why))
        bad = [r for r in f.ranks if r >= world]
        if bad:
            e.append(_err(("faults", i, "ranks"), f"rank {bad[0]} does not exist: the world "
                          f"size is {world} (ranks 0-{world - 1})"))
        if f.kind == "data_exhausted":
            if not 1 <= f.step < steps:
                e.append(_err(("faults", i, "step"), f"data_exhausted: the rank's data must end "
                              f"after 1 to train.steps - 1 = {steps - 1} steps"))
        elif f.step >= steps:
            e.append(_err(("faults", i, "step"), f"step {f.step} is beyond the run: train.steps "
                          f"= {steps} (steps 0-{steps - 1})"))
        if f.kind in ("hang", "skip_collective", "mismatch", "crash") and len(f.ranks) >= world \
                and world > 1 and f.kind != "crash":
            e.append(_err(("faults", i, "ranks"), f"{f.kind} on every rank is no mismatch: "
                          "leave at least one rank out"))
        if f.kind in ("mismatch", "skip_collective") and f.op in ("send", "recv"):
            e.append(_err(("faults", i, "op"), f"{f.kind} targets collectives, not "
                          "point-to-point send / recv (use hang or slow there)"))
    return e


def describe_all(items) -> list[str]:
    """One line per fault of a stored spec's `faults` list (what the run page and compare
    show); items a later schema would not know are shown by kind only."""
    out = []
    for item in items or []:
        try:
            out.append(FaultSpec(**{**item, "ranks": tuple(item.get("ranks", (0,)))}).describe())
        except TypeError:
            out.append(str(item.get("kind", "fault")))
    return out


def fault_dict(f: FaultSpec) -> dict:
    return {"kind": f.kind, "ranks": list(f.ranks), "step": f.step, "steps": f.steps,
            "op": f.op, "group": f.group, "mode": f.mode, "delay_s": f.delay_s,
            "exit_code": f.exit_code, "attempt": f.attempt}


# One-click examples for the new-run form (world size 2+, 5 steps): each fault kind once.
EXAMPLES: dict[str, dict] = {
    "crash": {"title": "rank 1 raises at step 2",
              "fault": {"kind": "crash", "ranks": [1], "step": 2}},
    "crash-exit": {"title": "rank 1 exits hard (code 3) at step 2",
                   "fault": {"kind": "crash", "ranks": [1], "step": 2, "mode": "exit"}},
    "hang": {"title": "rank 1 hangs inside the step-2 all_reduce",
             "fault": {"kind": "hang", "ranks": [1], "step": 2, "op": "all_reduce"}},
    "skip": {"title": "rank 1 skips one all_reduce at step 2",
             "fault": {"kind": "skip_collective", "ranks": [1], "step": 2, "op": "all_reduce"}},
    "mismatch": {"title": "rank 1 sends a different size at step 2",
                 "fault": {"kind": "mismatch", "ranks": [1], "step": 2, "op": "all_reduce",
                           "mode": "size"}},
    # (the title says the steps it applies to: `steps` 3 from step 1, not every step)
    "slow": {"title": "rank 1 arrives 0.5 s late at the first collective of steps 1-3",
             "fault": {"kind": "slow", "ranks": [1], "step": 1, "steps": 3, "delay_s": 0.5}},
    "data": {"title": "rank 1 runs out of data after 2 steps",
             "fault": {"kind": "data_exhausted", "ranks": [1], "step": 2}},
    "nan": {"title": "rank 1's gradients become NaN at step 2",
            "fault": {"kind": "nonfinite", "ranks": [1], "step": 2}},
}
