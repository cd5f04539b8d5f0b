"""POST /api/advise: the cluster the advisor sees (given, or this queue's measured bandwidth
from its latest collective sweep and FLOP/s from its latest compute calibration), then
jobs.theory.advisor, bounded (issue 36; docs/advisor.md "Bounds"): the request's fields are
checked here, the request is counted against its user's rate limit, and the search runs in a
child process of the API's pool (jobs.theory.pool), which counts it against the budget
before it evaluates any layout."""

from __future__ import annotations

import atexit
import os
import threading

from backend import crud
from backend.errors import Invalid, Unavailable
from jobs.analysis.history import sweep_points
from jobs.spec import ModelSpec, SpecError, resolve_preset
from jobs.theory import pool as workers
from jobs.theory.advisor import advise, check_request, configure_caches
from jobs.theory.budget import NARROW, Budget
from jobs.theory.bytecache import CACHE_BYTES

CALIBRATE = "run a compute calibration (preset compute-calibration) on the queue"


def sweep_bandwidth(db, queue: str) -> tuple[float, str] | None:
    """The peak all_reduce busbw of the queue's latest collective sweep (GB/s), with its
    provenance; None without one."""
    sweep = crud.latest_sweep(db, queue)
    if sweep is None:
        return None
    best = max((bw for (op, _n), pts in sweep_points(sweep.summary).items()
                if op == "all_reduce" for _b, bw in pts), default=None)
    if not best:
        return None
    return best, f"peak all_reduce busbw of collective sweep {sweep.id} on queue {queue!r}"


def calibration_flops(db, queue: str) -> tuple[float, str] | None:
    """The median achieved FLOP/s per device of the queue's latest compute calibration (over
    its ranks and timed passes, jobs/compute_bench.py), with its provenance; None without
    one."""
    run = crud.latest_compute_calibration(db, queue)
    if run is None:
        return None
    s = run.summary
    rate = s.get("median_flops_per_s")
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0:
        return None
    m = s.get("model") or {}
    shape = f"{m.get('arch')} hidden {m.get('hidden')}"
    if m.get("arch") == "gpt":
        shape += f" heads {m.get('heads')} seq_len {m.get('seq_len')}"
    return float(rate), (f"median achieved FLOP/s of compute calibration run {run.id} on queue "
                         f"{queue!r} (model shape {shape}, batch {s.get('batch')}, "
                         f"{s.get('dtype')} on {s.get('world_size')} x {s.get('device_name')})")


def _arch(model) -> str | None:
    """The model family the request names (its preset's, else the spec default); None when
    the model is invalid (the advisor then names the field)."""
    if not isinstance(model, dict):
        return None
    try:
        base = resolve_preset({"preset": model["preset"]}) if "preset" in model else {}
    except SpecError:
        return None
    return model.get("arch", base.get("model", {}).get("arch", ModelSpec().arch))


def _fill_bandwidth(db, cluster: dict, queue: str) -> None:
    missing = [k for k in ("intra_GBps", "inter_GBps") if k not in cluster]
    if not missing:
        return
    got = sweep_bandwidth(db, queue)
    if got is None:
        raise Invalid(f"queue: no collective sweep with all_reduce results on queue "
                      f"{queue!r}; run one or give cluster.intra_GBps and "
                      "cluster.inter_GBps", field="queue")
    # the sweep measures the link its ranks used (one host: intra); a missing inter
    # figure takes the same number, said so in the conventions
    for k in missing:
        cluster[k] = got[0]
    cluster["bandwidth_source"] = got[1] + " (" + ", ".join(missing) + ")"


def _fill_flops(db, cluster: dict, queue: str | None, arch: str | None) -> str | None:
    """Fill cluster.flops from the queue's calibration where gpt / mlp need it; else the hint
    for the advisor's "field required" error (None: nothing to add)."""
    if "flops" in cluster or arch not in ("gpt", "mlp"):
        return None
    got = calibration_flops(db, queue) if queue is not None else None
    if got is None:
        return (f"no succeeded compute calibration with results on queue {queue!r}: "
                f"{CALIBRATE}" if queue is not None else f"or give `queue` and {CALIBRATE}")
    cluster["flops"], cluster["flops_source"] = got
    return None


def _hint(e: dict, hint: str | None) -> dict:
    if hint and e["loc"] == ["cluster", "flops"] and e.get("type") == "missing":
        e = {**e, "msg": f"{e['msg']}; {hint}"}
    return {**e, "loc": ["body", *e["loc"]]}


_POOLS: dict[tuple, workers.Pool] = {}
_POOLS_LOCK = threading.Lock()


def cache_bytes(settings) -> int:
    return CACHE_BYTES if settings.advise_cache_bytes is None else settings.advise_cache_bytes


def search_pool(settings) -> workers.Pool:
    """This process's pool of search processes for these settings, made on first use."""
    key = (settings.advise_workers, settings.advise_timeout_s, settings.advise_memory_bytes,
           cache_bytes(settings))
    with _POOLS_LOCK:
        pool = _POOLS.get(key)
        if pool is None or pool.pid != os.getpid():
            pool = _POOLS[key] = workers.Pool(*key[:3], setup=(configure_caches, key[3:]))
    return pool


@atexit.register
def close_pools() -> None:
    with _POOLS_LOCK:
        pools = list(_POOLS.values())
        _POOLS.clear()
    for pool in pools:
        pool.close()


def budget_of(settings) -> Budget:
    return Budget(settings.advise_max_layouts, settings.advise_max_candidates,
                  settings.advise_max_sim_actions)


def _stopped(exc: Exception, setting: str) -> Invalid:
    return Invalid(errors=[{"loc": ["body", "cluster"], "type": "search_budget",
                            "msg": f"search stopped: it {exc} ({setting}); {NARROW}"}])


def _search(settings, *args, **kwargs) -> dict:
    try:
        return search_pool(settings).call(advise, *args, **kwargs)
    except workers.TimedOut as exc:
        raise _stopped(exc, "PARALAB_ADVISE_TIMEOUT_S") from exc
    except workers.OutOfMemory as exc:
        raise _stopped(exc, "PARALAB_ADVISE_MEMORY_BYTES") from exc
    except workers.Busy as exc:
        raise Unavailable(f"{exc} (PARALAB_ADVISE_WORKERS searches run at once)",
                          headers={"Retry-After": str(int(exc.retry_after_s) + 1)}) from exc
    except workers.Died as exc:
        raise Unavailable(f"the search failed: {exc}; try again") from exc


def queue_measured(db, queue: str) -> dict:
    """What the queue has measured, used or not: the page says a ranking at typed figures is
    against assumed hardware, and offers these instead (issue 37)."""
    bw, flops = sweep_bandwidth(db, queue), calibration_flops(db, queue)
    return {"queue": queue, "bandwidth_GBps": bw and bw[0], "bandwidth_source": bw and bw[1],
            "flops": flops and flops[0], "flops_source": flops and flops[1]}


def run_advise(db, body, settings, charge=lambda: None) -> dict:
    """`charge`: counts the request against its user's rate limit (429), called once the
    fields have passed their rules and before the search. The answer carries
    `queue_measured` (None without `queue`)."""
    cluster = body.cluster.model_dump(exclude_none=True)
    measured = None
    if body.queue is not None:
        cluster["queue"] = body.queue
        _fill_bandwidth(db, cluster, body.queue)
        measured = queue_measured(db, body.queue)
    for k in ("intra_GBps", "inter_GBps"):
        if k not in cluster:
            raise Invalid(errors=[{"loc": ["body", "cluster", k], "msg": "field required "
                                   "(or give `queue` with a collective sweep)",
                                   "type": "missing"}])
    hint = _fill_flops(db, cluster, body.queue, _arch(body.model))
    db.close()  # its connection goes back to the pool while the search runs
    fix = body.fix.model_dump(exclude_none=True) if body.fix is not None else None
    configure_caches(cache_bytes(settings))  # this process's memos (sweeps' evaluate_spec)
    try:
        check_request(body.model, body.global_batch, cluster, body.top, fix, body.compare_to)
        charge()
        out = _search(settings, body.model, body.global_batch, cluster, top=body.top,
                      fix=fix, budget=budget_of(settings), compare_to=body.compare_to)
    except SpecError as exc:
        raise Invalid(errors=[_hint(e, hint) for e in exc.errors]) from exc
    return {**out, "queue_measured": measured}
