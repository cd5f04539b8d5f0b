"""The flight recorder of a user's script (kind `script`), fed without changing the script.

`install(out, rank, world)` runs on every rank before the script (jobs/script_runner.py). It
replaces torch.distributed's collective and point-to-point functions (in `torch.distributed`
and `torch.distributed.distributed_c10d` alike, so `P2POp`'s check and `batch_isend_irecv`
see the same function) by wrappers that record each call in a jobs/flight.FlightRecorder, the
one the preset tracer keeps, so `flight/flight_rank_{R}` and `flight-rank{R}.json` have the
format the worker's hang watch and jobs/analysis/diagnose.py read. A blocking call is entered
before torch runs it and completed when it returns; an asynchronous one (`async_op=True`,
isend / irecv) is completed when the flusher thread sees its Work completed. Progress
(`last_progress_ns`) is a completed call or an optimizer step (torch's global
`register_optimizer_step_post_hook`: step N is the N-th optimizer step, 0-based). The flusher
thread writes the files whenever they changed, also while the main thread is blocked in a
collective. SIGUSR1 dumps every thread's stack to OUT/stack-rank{R}.txt (jobs/faults.py).

Not observed: collectives torch issues from C++ (DDP's gradient bucket all-reduces, issued by
its reducer) appear only as step progress. Wall clock (`time.time_ns`) is the aligned clock:
the ranks share the host. docs/scripts.md, "Hangs".
"""

from __future__ import annotations

import inspect
import os
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.optim.optimizer import register_optimizer_step_post_hook

from jobs.faults import install_stack_dump
from jobs.flight import FlightRecorder, frames_here

# torch.distributed function -> (flight op, the argument whose tensor(s) carry the payload)
WRAPPED = {"all_reduce": ("all_reduce", "tensor"), "broadcast": ("broadcast", "tensor"),
           "reduce": ("reduce", "tensor"), "all_gather": ("all_gather", "tensor_list"),
           "all_gather_into_tensor": ("all_gather", "output_tensor"),
           "reduce_scatter": ("reduce_scatter", "input_list"),
           "reduce_scatter_tensor": ("reduce_scatter", "input"),
           "all_to_all_single": ("all_to_all", "input"), "all_to_all": ("all_to_all",
                                                                        "input_tensor_list"),
           "gather": ("gather", "tensor"), "scatter": ("scatter", "tensor"),
           "barrier": ("barrier", None), "send": ("send", "tensor"), "recv": ("recv", "tensor"),
           "isend": ("isend", "tensor"), "irecv": ("irecv", "tensor")}
ASYNC = ("isend", "irecv")


def _payload(x) -> tuple[int, str | None]:
    """(bytes, dtype name) of a tensor or a list of tensors."""
    ts = [x] if isinstance(x, torch.Tensor) else [t for t in (x or ()) if
                                                  isinstance(t, torch.Tensor)]
    if not ts:
        return 0, None
    return (sum(t.numel() * t.element_size() for t in ts),
            str(ts[0].dtype).removeprefix("torch."))


class ScriptFlight:
    """What jobs/flight.FlightRecorder reads of a tracer (rank, world_size, coords, step,
    steps_completed, last_progress_ns, group_ranks, now), the wrappers and the flusher."""

    def __init__(self, out: Path, rank: int, world: int, flush_interval_s: float = 0.25):
        self.rank, self.world_size, self.coords = rank, world, {}
        self.step, self.steps_completed = 0, 0
        self.group_ranks: dict[str, list[int]] = {}
        self.flight = FlightRecorder(Path(out) / f"flight-rank{rank}.json")
        self.last_progress_ns = self.now()
        self._keys: dict[int, str] = {}
        self._pending: list[tuple] = []  # (group key, entry, Work) of asynchronous calls
        self._lock = threading.Lock()
        self._local = threading.local()
        self._saved: dict[tuple, object] = {}
        self._hook = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._flusher, args=(flush_interval_s,),
                                        name=f"script-flight-{rank}", daemon=True)

    @staticmethod
    def now() -> int:
        return time.time_ns()

    # --- install / close -----------------------------------------------------------------------
    def start(self) -> ScriptFlight:
        for name, (op, arg) in WRAPPED.items():
            orig = getattr(c10d, name, None)
            if orig is None:
                continue
            wrapper = self._wrap(orig, op, arg)
            for mod in (dist, c10d):
                if getattr(mod, name, None) is orig:
                    self._saved[(mod, name)] = orig
                    setattr(mod, name, wrapper)
        self._hook = register_optimizer_step_post_hook(self._on_step)
        self._thread.start()  # the first file is written once the script's group is up
        return self

    def close(self, reason: str = "ok") -> None:
        """Restore torch's functions, stop the flusher, write the files a last time."""
        for (mod, name), orig in self._saved.items():
            setattr(mod, name, orig)
        self._saved.clear()
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)
        self._poll()
        self.flight.extra["closed"] = {"reason": reason, "ts_ns": self.now()}
        self.flight.write(self)

    # --- recording -----------------------------------------------------------------------------
    def _key(self, group) -> str:
        """The flight group key of a process group ('world' for the default one); its global
        ranks go to group_ranks."""
        pg = group if group is not None else c10d._get_default_group()
        key = self._keys.get(id(pg))
        if key is None:
            key = "world" if pg is c10d._get_default_group() else f"pg{pg.group_name}"
            self._keys[id(pg)] = key
            self.group_ranks[key] = list(dist.get_process_group_ranks(pg))
        return key

    def _wrap(self, orig, op: str, arg: str | None):
        sig = inspect.signature(orig)
        me = self

        def wrapper(*args, **kwargs):
            if getattr(me._local, "busy", False) or not dist.is_initialized():
                return orig(*args, **kwargs)
            try:
                entry, key = me._enter(sig, op, arg, args, kwargs)
            except Exception:  # noqa: BLE001 - never fail the script's call for the record
                return orig(*args, **kwargs)
            me._local.busy = True  # a wrapped call torch makes inside this one: not recorded
            try:
                work = orig(*args, **kwargs)
            finally:
                me._local.busy = False
            is_async = op in ASYNC or bool(kwargs.get("async_op")) or (
                "async_op" in sig.parameters and _bound(sig, args, kwargs).get("async_op"))
            if is_async and work is not None and hasattr(work, "is_completed"):
                with me._lock:
                    me._pending.append((key, entry, work))
            else:
                me.last_progress_ns = me.flight.done(key, entry, me.now())
            return work

        wrapper.__wrapped__ = orig
        wrapper.__name__, wrapper.__doc__ = orig.__name__, orig.__doc__
        return wrapper

    def _enter(self, sig, op, arg, args, kwargs) -> tuple[dict, str]:
        b = _bound(sig, args, kwargs)
        group = b.get("group")
        key = self._key(group)
        ranks = self.group_ranks[key]
        nbytes, dtype = _payload(b.get(arg)) if arg else (0, None)
        peer = None
        if op in ("send", "isend", "recv", "irecv"):
            peer = b.get("group_dst", b.get("group_src"))
            g = b.get("dst", b.get("src"))
            if peer is None and g is not None and g in ranks:
                peer = ranks.index(g)
        entry = self.flight.enter(key, self.flight.next_seq(key), op, payload_bytes=nbytes,
                                  dtype=dtype, group_size=len(ranks), step=self.step,
                                  t_ns=self.now(), peer=peer, frames=frames_here())
        return entry, key

    def _on_step(self, optimizer, args, kwargs) -> None:
        self.steps_completed += 1
        self.step = self.steps_completed
        self._poll()
        self.last_progress_ns = self.now()
        self.flight.dirty = True

    def _poll(self) -> None:
        """Complete the asynchronous calls whose Work has completed."""
        with self._lock:
            pending, self._pending = self._pending, []
        still = []
        for key, entry, work in pending:
            try:
                finished = work.is_completed()
            except Exception:  # noqa: BLE001 - a failed Work stays open (the run fails)
                finished = False
            if finished:
                self.last_progress_ns = self.flight.done(key, entry, self.now())
            else:
                still.append((key, entry, work))
        with self._lock:
            self._pending = still + self._pending

    def _flusher(self, interval: float) -> None:
        up = False
        while not self._stop.wait(interval):
            try:
                if not up:
                    # as for presets (jobs/trace.py), the hang watch's clock starts with the
                    # first flight file, once the process group is up: the script's imports,
                    # model build and rendezvous are runtime.timeout_s's business
                    if not dist.is_initialized():
                        continue
                    up = True
                    self.last_progress_ns = max(self.last_progress_ns, self.now())
                self._poll()
                if self.flight.dirty:
                    self.flight.write(self, periodic=True)
            except Exception:  # noqa: BLE001 - never take the run down from the flusher
                pass


def _bound(sig, args, kwargs) -> dict:
    try:
        return dict(sig.bind(*args, **kwargs).arguments)
    except TypeError:
        return dict(kwargs)


def install(out, rank: int, world: int | None = None) -> ScriptFlight:
    """Stack dumps on SIGUSR1 and the flight recorder, started (the runner closes it)."""
    world = int(os.environ.get("WORLD_SIZE", "1")) if world is None else world
    install_stack_dump(out, rank)
    return ScriptFlight(Path(out), rank, world).start()
