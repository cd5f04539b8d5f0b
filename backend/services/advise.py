"""POST /api/advise: the cluster the advisor sees (given, or this queue's measured bandwidth
from its latest collective sweep), then jobs.theory.advisor."""

from __future__ import annotations

from backend import crud
from backend.errors import Invalid
from jobs.analysis.history import sweep_points
from jobs.spec import SpecError
from jobs.theory.advisor import advise


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


def run_advise(db, body) -> dict:
    cluster = body.cluster.model_dump(exclude_none=True)
    if body.queue is not None:
        cluster["queue"] = body.queue
        missing = [k for k in ("intra_GBps", "inter_GBps") if k not in cluster]
        if missing:
            got = sweep_bandwidth(db, body.queue)
            if got is None:
                raise Invalid(f"queue: no collective sweep with all_reduce results on queue "
                              f"{body.queue!r}; run one or give cluster.intra_GBps and "
                              "cluster.inter_GBps", field="queue")
            # the sweep measures the link its ranks used (one host: intra); a missing inter
            # figure takes the same number, said so in the conventions
            for k in missing:
                cluster[k] = got[0]
            cluster["bandwidth_source"] = got[1] + " (" + ", ".join(missing) + ")"
    for k in ("intra_GBps", "inter_GBps"):
        if k not in cluster:
            raise Invalid(errors=[{"loc": ["body", "cluster", k], "msg": "field required "
                                   "(or give `queue` with a collective sweep)",
                                   "type": "missing"}])
    try:
        return advise(body.model, body.global_batch, cluster, top=body.top)
    except SpecError as exc:
        raise Invalid(errors=[{**e, "loc": ["body", *e["loc"]]} for e in exc.errors]) from exc
