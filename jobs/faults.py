"""Injected faults (spec `faults`, jobs/faultspec.py; docs/faults.md) and the run's own fault
instruments: stack dumps on SIGUSR1 and the non-finite check.

`install(spec, out, rank, world, dims, tracer)` runs on every rank (jobs/train.py): it registers
faulthandler on SIGUSR1 (all threads, into `OUT/stack-rank{R}.txt`), tells the tracer each mesh
group's global ranks (for the flight file) and sets `tracer.fault` to this rank's `Injector`,
which the training loop (jobs/loop.py) and the tracer (`Tracer.comm_start`) call:

    data_ends(step)        data_exhausted: True at the step this rank's data has run out
    at_step(step)          crash (raise / os._exit, once this host's other ranks wait in a
                           collective: `_peers_waiting`), slow compute (sleep inside the step)
    on_comm(op, group, axis, payload, n, args)  from comm_start, before the record exists:
                           slow comm (sleep), hang (block here: the rank never enters),
                           skip (no record; the torch call becomes a no-op), mismatch (the
                           torch call really gets another size or op; the record says so)
    after_step(step, loss, strategy)   non-finite loss / parameters: flight note + raise

Collective faults reach the collectives that go through the tracer before their
torch.distributed call (the reference engine); the native engine's (DDP's C++ reducer, FSDP2,
DTensor) are recorded after the fact, so faultspec refuses hang / skip / mismatch / slow (comm)
for engine native.
"""

from __future__ import annotations

import faulthandler
import json
import math
import os
import signal
import time

import torch
import torch.distributed as dist

from jobs.dims import AXES
from jobs.faultspec import native_refusal

# the torch.distributed functions a traced op may be issued with (patched once, then restored)
TORCH_FNS = {"all_reduce": ("all_reduce",), "broadcast": ("broadcast",), "reduce": ("reduce",),
             "all_gather": ("all_gather_into_tensor",),
             "reduce_scatter": ("reduce_scatter_tensor",),
             "all_to_all": ("all_to_all_single",), "barrier": ("barrier",)}
def name_op(fn_name: str) -> str:
    return next(op for op, names in TORCH_FNS.items() if fn_name in names)


ESIZE = {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2, "int64": 8, "int32": 4}
_STACK_FILES: list = []  # kept open: faulthandler writes to the descriptor


def install_stack_dump(out, rank: int) -> None:
    """SIGUSR1 -> every thread's Python stack appended to OUT/stack-rank{R}.txt (the worker
    sends it to every rank of a hung run before stopping it)."""
    if not hasattr(signal, "SIGUSR1"):  # pragma: no cover - not POSIX
        return
    f = open(os.path.join(out, f"stack-rank{rank}.txt"), "a")  # noqa: SIM115 - kept open
    _STACK_FILES.append(f)
    faulthandler.register(signal.SIGUSR1, file=f, all_threads=True, chain=False)
    faulthandler.enable(file=f, all_threads=True)  # SIGABRT / SIGSEGV: the stack as last words


def group_ranks(dims, rank: int, world: int) -> dict[str, list[int]]:
    """Per mesh axis: the global ranks of this rank's group (jobs.dims: the layout)."""
    assert world == dims.world_size, (world, dims.world_size)
    return {axis: dims.group_ranks(axis, rank) for axis in AXES}


def install(spec, out, rank: int, world: int, dims, tracer) -> Injector:
    for f in spec.faults or ():  # spec validation refuses them too, given the engine
        why = native_refusal(f) if spec.parallel.engine == "native" else None
        if why:
            raise ValueError(f"faults: {why}")
    install_stack_dump(out, rank)
    tracer.group_ranks.update(group_ranks(dims, rank, world))
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))
    inj = Injector(spec.faults or (), rank, attempt, tracer)
    tracer.fault = inj if inj.faults else None  # no faults here: no per-collective call
    return inj


def of(tracer) -> Injector:
    """The rank's injector (a no-fault one where this rank has none: the loop's non-finite
    check still runs)."""
    inj = getattr(tracer, "fault", None)
    return inj if inj is not None else Injector((), getattr(tracer, "rank", 0), 0, tracer)


class InjectedCrash(RuntimeError):
    """The exception of a `crash` fault (mode exception)."""


PEER_WAIT_S = 10.0  # the most a crash waits for its peers to block (Injector._peers_waiting)


def _waits_or_closed(path, step: int) -> bool:
    """True if the flight file at `path` says closed, exited, or a collective of step >=
    `step` in flight (absent: not written yet)."""
    try:
        f = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):  # not yet written (its flusher's first turn)
        return False
    if f.get("closed") or f.get("exit"):
        return True
    return any((g.get("in_flight") or {}).get("step", -1) >= step
               for g in (f.get("groups") or {}).values())


def _hang_forever() -> None:
    while True:  # time.sleep releases the GIL: the flusher keeps the flight file current
        time.sleep(3600)


def _done_work(async_op: bool):
    """What a skipped torch.distributed call returns: None, or a completed Work-like."""
    if not async_op:
        return None
    fut = torch.futures.Future()
    fut.set_result(None)

    class _Done:
        def wait(self, timeout=None):
            return True

        def is_completed(self):
            return True

        def get_future(self):
            return fut
    return _Done()


class Injector:
    def __init__(self, faults, rank: int, attempt: int, tracer):
        self.rank, self.tr = rank, tracer
        self.faults = [f for f in faults if f.fires(rank, attempt)]
        self.fired: set = set()
        self._poisoned = False

    # --- loop hooks ---------------------------------------------------------------------------
    def data_ends(self, step: int) -> bool:
        return any(f.kind == "data_exhausted" and step >= f.step for f in self.faults)

    def at_step(self, step: int) -> None:
        for f in self.faults:
            if f.kind == "crash" and f.step == step:
                self._peers_waiting(f, step)
                if f.resolved_mode == "exit":
                    self._exit(f, step)
                raise InjectedCrash(f"injected crash on rank {self.rank} at step {step}")
            if (f.kind == "slow" and f.resolved_mode == "compute"
                    and f.step <= step < f.step + f.steps):
                time.sleep(f.delay_s)
            if f.kind == "nonfinite" and f.step == step:
                self._poisoned = f.resolved_mode

    def _peers_waiting(self, f, step: int) -> None:
        """Hold a crash until this host's other ranks are blocked in a collective of this step
        (their flight files, written by each rank's flusher, show one in flight) or have
        closed, at most PEER_WAIT_S. A crash models a rank dying while the others wait for it;
        fired at the step's start it would race their compute against the agent's kill (a
        torchrun monitor interval), and the diagnosis could not say where they waited. Ranks on
        other hosts and the fault's own ranks are not waited for."""
        folder = self.tr.flight.path.parent
        # torchrun numbers a node's ranks contiguously: this node's are [first, first + local)
        local = int(os.environ.get("LOCAL_WORLD_SIZE", self.tr.world_size))
        first = self.rank - int(os.environ.get("LOCAL_RANK", self.rank))
        peers = [r for r in range(first, first + local) if r not in f.ranks]
        deadline = time.monotonic() + PEER_WAIT_S
        while peers and time.monotonic() < deadline:
            peers = [r for r in peers if not _waits_or_closed(folder / f"flight-rank{r}.json",
                                                              step)]
            time.sleep(0.05)

    def _exit(self, f, step: int) -> None:
        """A hard exit: last words into the flight file and the trace, then os._exit."""
        words = f"injected hard exit (code {f.exit_code}) on rank {self.rank} at step {step}"
        self.tr.flight_note("exit", {"code": f.exit_code, "reason": words, "step": step,
                                     "ts_ns": self.tr.now()})
        self.tr.instant("exit", code=f.exit_code, reason=words)
        self.tr.write_flight()
        self.tr.flush()
        print(words, flush=True)
        os._exit(f.exit_code)

    def poison(self, output):
        """Forward hook on the model: the step's output (hence loss and gradients) times NaN /
        Inf on the faulty rank at the fault's step."""
        if not self._poisoned or not isinstance(output, torch.Tensor):
            return None
        factor = math.nan if self._poisoned == "nan" else math.inf
        return output * factor

    def attach(self, comp) -> None:
        if any(f.kind == "nonfinite" for f in self.faults):
            comp.strategy.model.register_forward_hook(lambda m, a, out: self.poison(out))

    def after_step(self, step: int, loss, strategy) -> None:
        """Fail the run at the first non-finite loss or parameter, locally (no collective):
        the rank whose own loss was non-finite says so, the others that they got non-finite
        parameters through a collective. The flight file keeps it for the diagnosis."""
        self._poisoned = False
        what = value = None
        if loss is not None and not math.isfinite(loss):
            what, value = "loss", loss
        else:
            with torch.no_grad():  # NaN / Inf survive a sum; one device sync per step
                sums = [(p.to_local() if hasattr(p, "to_local") else p).detach().float().sum()
                        for p in strategy.model.parameters()]
                total = float(torch.stack(sums).sum()) if sums else 0.0
            if not math.isfinite(total):
                what, value = "params", total
        if what is None:
            return
        note = {"step": step, "what": what, "value": str(value), "ts_ns": self.tr.now()}
        self.tr.flight_note("nonfinite", note)
        self.tr.record("nonfinite", **note)
        self.tr.write_flight()
        if what == "loss":
            raise FloatingPointError(f"rank {self.rank}: non-finite local loss ({value}) at "
                                     f"step {step}")
        raise FloatingPointError(f"rank {self.rank}: non-finite parameters after step {step} "
                                 "(this rank's local loss was finite: they came through a "
                                 "collective)")

    # --- tracer hook --------------------------------------------------------------------------
    def on_comm(self, op: str, group: str, axis: str, payload: int, group_size: int,
                args: dict):
        """Called by Tracer.comm_start before it records the op: None (go on), "skip" (no
        record), or {"op" / "payload_bytes": what is really issued}."""
        if not self.faults:
            return None
        step = self.tr.step
        for i, f in enumerate(self.faults):
            if f.kind not in ("hang", "skip_collective", "mismatch", "slow"):
                continue
            if f.kind == "slow":
                if f.resolved_mode != "comm" or not f.step <= step < f.step + f.steps:
                    continue
            elif f.step != step:
                continue
            key = (i, step)
            if key in self.fired or (f.op and f.op != op) or (f.group and f.group != axis):
                continue
            p2p = op in ("send", "recv", "isend", "irecv")
            if f.kind in ("skip_collective", "mismatch") and (p2p or op not in TORCH_FNS):
                continue
            self.fired.add(key)
            if f.kind == "slow":
                time.sleep(f.delay_s)
                return None
            if f.kind == "hang":
                self.tr.write_flight()
                _hang_forever()
            if f.kind == "skip_collective":
                self.tr.write_flight()  # a backend may abort on what follows
                self._patch_once(op, self._skip)
                return "skip"
            return self._mismatch(f, op, payload, group_size, args)
        return None

    def _skip(self, name, fn, a, k):
        """The skipped call: nothing issued. The rank's next call of that op (the others'
        previous one: what the backend may abort on) writes the flight file first."""
        self._patch_once(name_op(name), lambda _n, f, a2, k2: f(*a2, **k2))
        return _done_work(k.get("async_op", False))

    def _patch_once(self, op: str, replacement) -> None:
        """The next call of op's torch.distributed function(s) runs `replacement(name,
        original, args, kwargs)` instead; then the originals are back."""
        originals = {n: getattr(dist, n) for n in TORCH_FNS[op] if hasattr(dist, n)}

        def restore():
            for n, fn in originals.items():
                setattr(dist, n, fn)

        for name, fn in originals.items():
            def patched(*a, _name=name, _fn=fn, **k):
                restore()
                self.tr.write_flight()  # the altered record on disk: the backend may abort
                return replacement(_name, _fn, a, k)
            setattr(dist, name, patched)

    def _mismatch(self, f, op: str, payload: int, group_size: int, args: dict) -> dict:
        es = ESIZE.get(args.get("dtype") or "", 4)
        if f.resolved_mode == "op":
            new = "broadcast" if op == "all_reduce" else "all_reduce"

            def issue(name, fn, a, k):
                group = k.get("group")
                t = {"all_gather": a[0] if a else k.get("output_tensor"),
                     "reduce_scatter": a[1] if len(a) > 1 else k.get("input")}.get(
                    op, a[0] if a else k.get("tensor"))
                if new == "broadcast":
                    src = dist.get_global_rank(group, 0) if group is not None else 0
                    return dist.broadcast(t, src, group=group, async_op=k.get("async_op", False))
                return dist.all_reduce(t, group=group, async_op=k.get("async_op", False))
            self._patch_once(op, issue)
            return {"op": new}
        # size: half the elements per rank (two where there was one)
        n = max(1, group_size) if op in ("all_gather", "reduce_scatter") else 1
        per = max(1, payload // es // n)
        new_per = per // 2 if per > 1 else 2

        def issue(name, fn, a, k):
            group, async_op = k.get("group"), k.get("async_op", False)
            ref = a[0] if a else next(iter(k.values()))
            kw = {"dtype": ref.dtype, "device": ref.device}
            if op == "all_gather":
                gs = dist.get_world_size(group)
                return fn(torch.zeros(new_per * gs, **kw), torch.zeros(new_per, **kw),
                          group=group, async_op=async_op)
            if op == "reduce_scatter":
                gs = dist.get_world_size(group)
                return fn(torch.zeros(new_per, **kw), torch.zeros(new_per * gs, **kw),
                          group=group, async_op=async_op)
            return fn(torch.zeros(new_per, **kw), *a[1:], **k)
        self._patch_once(op, issue)
        return {"payload_bytes": new_per * es * n}
