"""Gang placement of multi-host runs (runtime.nnodes > 1): all of a run's nodes or none.

A run with nnodes = N needs N distinct hosts of its queue, each with one worker that has a free
job slot and `nproc_per_node` free ranks (a worker's ranks: its CUDA devices, or on a CPU host
PARALAB_WORKER_RANKS). What is taken is read from the database, not from the workers' last
heartbeats: the active nodes of other multi-host runs and the one-host runs running there.

All-or-nothing in one transaction, with the queue's worker rows locked (PostgreSQL: SELECT ...
FOR UPDATE, in name order; SQLite: BEGIN IMMEDIATE, the database's one write lock, the most the
embedded default can do: one placer at a time, across processes): two runs competing for the same
hosts can never each hold half and wait for the other. Runs of a queue are placed oldest first,
and a run that does not fit blocks the younger multi-host runs of its queue (no backfill), so a
big run is never starved by a stream of smaller ones; but only a run that would fit were the
hosts free (fits_when_free): one that no combination of the live hosts can hold is skipped, is
refused at submission when the queue's recently seen hosts cannot hold it (submit_errors), and
fails after `gang_unplaceable_timeout_s` (fail_unplaceable), so no run waits forever. Messages go
out after the commit, one per node, to its worker's own queue (node_queue in
paralab_core/queue.py); the claim of each node is atomic, so a redelivered message never
launches a node twice (docs/hosts.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from backend import crud
from backend.core.config import Settings
from backend.models import Run, Worker, utcnow
from jobs.spec import JobSpec
from paralab_core.queue import enqueue_node

log = logging.getLogger(__name__)


@dataclass
class Capacity:
    """What one live worker has, and what is taken of it."""

    worker: str
    host: str
    slots: int
    ranks: int
    used_slots: int = 0
    used_ranks: int = 0
    held_by: list[str] = field(default_factory=list)

    @property
    def free_slots(self) -> int:
        return max(self.slots - self.used_slots, 0)

    @property
    def free_ranks(self) -> int:
        return max(self.ranks - self.used_ranks, 0)


def worker_ranks(w: Worker) -> int:
    """How many ranks a worker can host at once: its CUDA devices, else what it reports
    (PARALAB_WORKER_RANKS), else its job slots."""
    gpus = sum(1 for d in w.devices if d.get("type") == "cuda")
    reported = (w.info or {}).get("ranks")
    return gpus or (reported if isinstance(reported, int) and reported > 0 else w.slots)


def capacities(db: Session, settings: Settings, queue: str,
               workers: list[Worker] | None = None) -> list[Capacity]:
    if workers is None:
        workers = [w for w in crud.list_workers(db, seen_within_s=settings.worker_alive_s)
                   if w.queue == queue]
    caps = {w.name: Capacity(w.name, w.host, w.slots, worker_ranks(w)) for w in workers}
    for n in crud.active_nodes(db):
        if (c := caps.get(n.worker)) is not None:
            c.used_slots, c.used_ranks = c.used_slots + 1, c.used_ranks + n.ranks
            c.held_by.append(n.run_id)
    for run in crud.running_runs(db):
        if run.nnodes == 1 and (c := caps.get(run.worker_host or "")) is not None:
            c.used_slots, c.used_ranks = c.used_slots + 1, c.used_ranks + run.world_size
            c.held_by.append(run.id)
    return sorted(caps.values(), key=lambda c: (c.host, c.worker))


def pick(caps: list[Capacity], nnodes: int, per_node: int) -> list[Capacity] | None:
    """N distinct hosts, on each the first worker (by name) with a free slot and `per_node`
    free ranks; None when fewer than N hosts have one."""
    chosen: dict[str, Capacity] = {}
    for c in caps:
        if c.host not in chosen and c.free_slots >= 1 and c.free_ranks >= per_node:
            chosen[c.host] = c
    return list(chosen.values())[:nnodes] if len(chosen) >= nnodes else None


def fits_when_free(caps: list[Capacity], nnodes: int, per_node: int) -> bool:
    """Would `pick` find hosts were nothing taken: N distinct hosts, each with a worker of at
    least `per_node` ranks. The one rule for "can this run ever be placed on these hosts"."""
    return len({c.host for c in caps if c.slots >= 1 and c.ranks >= per_node}) >= nnodes


def ranks_per_node(run: Run) -> int:
    return int(((run.spec or {}).get("runtime") or {}).get("nproc_per_node") or 1)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def never_fits(caps: list[Capacity], queue: str, n: int, per: int,
               kind: str = "live") -> str | None:
    """Why no combination of these hosts can hold the run even when free, in words (naming
    the hosts); None when they could (fits_when_free)."""
    if fits_when_free(caps, n, per):
        return None
    q = repr(queue)
    hosts = sorted({c.host for c in caps})
    if not caps:
        return (f"needs {_plural(n, 'host')} at once; no {kind} worker serves queue {q}: start "
                f"one per host with PARALAB_QUEUE={queue} (docs/deploy.md)")
    if len(hosts) < n:
        return (f"needs {_plural(n, 'host')} at once; queue {q} has "
                f"{_plural(len(hosts), kind + ' host')} ({', '.join(hosts)})")
    largest = max(c.ranks for c in caps)
    if largest < per:
        return (f"needs {per} ranks on each host (nproc_per_node); the largest worker of "
                f"queue {q} hosts {largest} ({', '.join(hosts)})")
    big = sorted({c.host for c in caps if c.ranks >= per})
    return (f"needs {_plural(n, 'host')} with {per} ranks each (nproc_per_node); only "
            f"{len(big)} of the {_plural(len(hosts), kind + ' host')} of queue {q} has a "
            f"worker that large ({', '.join(big)})")


def wait_reason(caps: list[Capacity], run: Run, ahead: list[str]) -> str:
    """Why a multi-host run is not placed yet, in words: which hosts, what is missing."""
    n, per = run.nnodes, ranks_per_node(run)
    q = repr(run.queue)
    if (never := never_fits(caps, run.queue, n, per)) is not None:
        return never
    if ahead:
        return (f"behind {_plural(len(ahead), 'earlier multi-host run')} of queue {q} "
                f"({', '.join(ahead[:3])}): runs are placed oldest first")
    free = "; ".join(
        f"{c.host}: {c.free_ranks} of {c.ranks} ranks free"
        + (f", held by {', '.join(dict.fromkeys(c.held_by))}" if c.held_by else "")
        for c in caps)
    fit = len({c.host for c in caps if c.free_slots >= 1 and c.free_ranks >= per})
    return (f"needs {_plural(n, 'host')} with {per} free ranks each at once; "
            f"{_plural(fit, 'host')} of queue {q} has them now ({free})")


def seen_capacities(db: Session, settings: Settings, queue: str) -> list[Capacity]:
    """What the queue's workers offer, counting every worker seen within the unplaceable bound
    (plus the live window): a worker briefly away (its host restarting) still counts. Any
    worker live at some moment of the last `gang_unplaceable_timeout_s` is among them, so a run
    these cannot hold could not have been placed at any moment of it."""
    within = settings.gang_unplaceable_timeout_s + settings.worker_alive_s
    return [Capacity(w.name, w.host, w.slots, worker_ranks(w))
            for w in crud.list_workers(db, seen_within_s=within) if w.queue == queue]


def submit_errors(db: Session, settings: Settings, spec: JobSpec) -> list[dict]:
    """A multi-host run that the queue's recently seen hosts can never hold is refused at
    submission (422 on runtime.nnodes, or nproc_per_node when there are hosts enough but none
    large enough). A queue with no worker seen yet refuses nothing: its workers may still be
    starting, and fail_unplaceable ends the run after the bound if none comes."""
    rt = spec.runtime
    if rt.nnodes <= 1:
        return []
    caps = seen_capacities(db, settings, rt.queue)
    if not caps or (why := never_fits(caps, rt.queue, rt.nnodes, rt.nproc_per_node,
                                      kind="known")) is None:
        return []
    field_ = "nnodes" if len({c.host for c in caps}) < rt.nnodes else "nproc_per_node"
    return [{"loc": ["body", "runtime", field_], "type": "unplaceable",
             "msg": f"no combination of the hosts of queue {rt.queue!r} can ever hold this run: "
                    f"{why} (known: a worker reported in the last "
                    f"{settings.gang_unplaceable_timeout_s + settings.worker_alive_s:g} s); "
                    "start workers on more hosts, or lower runtime.nnodes / nproc_per_node"}]


def fail_unplaceable(db: Session, settings: Settings) -> list[str]:
    """Waiting multi-host runs older than `gang_unplaceable_timeout_s` that no combination of
    the hosts seen meanwhile could hold (seen_capacities) fail with the reason; returns their
    IDs. Runs that could fit keep waiting however long: their hosts are busy, not missing."""
    bound = settings.gang_unplaceable_timeout_s
    cutoff = utcnow() - timedelta(seconds=bound)
    seen: dict[str, list[Capacity]] = {}
    failed = []
    for run in crud.waiting_gang_runs(db):
        if run.created_at >= cutoff:
            continue
        if run.queue not in seen:
            seen[run.queue] = seen_capacities(db, settings, run.queue)
        if fits_when_free(seen[run.queue], run.nnodes, ranks_per_node(run)):
            continue
        # in words over the live hosts (a subset of those seen: they cannot hold it either)
        why = never_fits(capacities(db, settings, run.queue), run.queue, run.nnodes,
                         ranks_per_node(run))
        if why is None:  # a worker reported in since seen_capacities: it may fit now
            continue
        if crud.fail_gang(db, run.id, f"not placed within {bound:g} s "
                          f"(PARALAB_GANG_UNPLACEABLE_TIMEOUT_S): no combination of the hosts of "
                          f"queue {run.queue!r} could hold it: {why}"):
            failed.append(run.id)
    return failed


def waiting_ahead(db: Session, run: Run, caps: list[Capacity]) -> list[str]:
    """The queued multi-host runs of its queue placed before it (older, not placed, and able
    to fit these hosts: one that cannot is skipped by the placer, see place_waiting)."""
    ahead = []
    for r in crud.waiting_gang_runs(db):
        if r.id == run.id:
            return ahead
        if r.queue == run.queue and fits_when_free(caps, r.nnodes, ranks_per_node(r)):
            ahead.append(r.id)
    return []


def why_waiting(db: Session, settings: Settings, run: Run) -> str | None:
    """The run page's and the cluster page's reason a queued multi-host run waits."""
    if run.status != "queued" or run.nnodes <= 1:
        return None
    if any(n.status == "reserved" for n in crud.nodes_of(db, run.id)):
        return "placed: waiting for its workers to start their nodes"
    caps = capacities(db, settings, run.queue)
    return wait_reason(caps, run, waiting_ahead(db, run, caps))


def node_view(db: Session, run_id: str) -> list[dict]:
    """A multi-host run's nodes as the run page, the API and the workers see them."""
    return [{"node": n.node, "host": n.host, "worker": n.worker, "ranks": n.ranks,
             "status": n.status, "endpoint": n.endpoint, "started_at": n.started_at,
             "finished_at": n.finished_at, "exit_code": n.exit_code, "error": n.error}
            for n in crud.nodes_of(db, run_id)]


def _lock(db: Session, queue: str) -> list[Worker]:
    if db.get_bind().dialect.name == "sqlite":
        db.commit()  # BEGIN cannot nest
        db.connection().exec_driver_sql("BEGIN IMMEDIATE")
        return list(db.scalars(select(Worker).where(Worker.queue == queue)
                               .order_by(Worker.name)))
    return list(db.scalars(select(Worker).where(Worker.queue == queue)
                           .order_by(Worker.name).with_for_update()))


def place_waiting(db: Session, settings: Settings,
                  publish: Callable[[Settings, str, int, str], None] = enqueue_node
                  ) -> list[str]:
    """Place every waiting multi-host run that fits, oldest first per queue; returns their
    IDs. Their node messages are published after the placement is committed."""
    placed: list[tuple[str, list[str]]] = []
    blocked: set[str] = set()
    for run in crud.waiting_gang_runs(db):
        if run.queue in blocked:
            continue
        per = ranks_per_node(run)
        try:
            locked = _lock(db, run.queue)
            alive = {w.name for w in crud.list_workers(db, seen_within_s=settings.worker_alive_s)}
            caps = capacities(db, settings, run.queue, [w for w in locked if w.name in alive])
            still = db.get(Run, run.id)
            db.refresh(still)
            if still.status != "queued" or still.cancel_requested or any(
                    n.status in ("reserved", "running") for n in crud.nodes_of(db, run.id)):
                db.rollback()
                continue
            chosen = pick(caps, run.nnodes, per)
            if chosen is None:
                db.rollback()
                if fits_when_free(caps, run.nnodes, per):  # it waits for its hosts to free:
                    blocked.add(run.queue)  # nothing younger takes them meanwhile
                continue  # else it never fits these hosts: it blocks nothing (fail_unplaceable)
            crud.reserve(db, run.id, [(c.worker, c.host) for c in chosen], per)
            db.commit()
        except Exception:
            db.rollback()
            raise
        placed.append((run.id, [c.worker for c in chosen]))
        log.info("run %s placed on %s", run.id, ", ".join(c.host for c in chosen))
    for run_id, workers in placed:
        for node, worker in enumerate(workers):
            try:
                publish(settings, run_id, node, worker)
            except Exception:  # noqa: BLE001 - the reconciler publishes unclaimed nodes again
                log.warning("publishing node %d of run %s failed", node, run_id, exc_info=True)
    return [r for r, _ in placed]


def reconcile_nodes(db: Session, settings: Settings,
                    publish: Callable[[Settings, str, int, str], None] = enqueue_node
                    ) -> dict[str, list[str]]:
    """Placed nodes no worker claimed within the claim bound: published again while their
    worker lives; a placement whose worker died before any node started is released (the run
    is placed again); a running run whose unstarted node's worker died fails as host lost;
    after `queue_claim_attempts` publications the run fails with the reason. Then waiting
    runs that could not be placed within the bound fail ("unplaceable"), and the rest are
    placed."""
    out: dict[str, list[str]] = {"republished": [], "released": [], "failed": [],
                                 "unplaceable": []}
    alive = {w.name for w in crud.list_workers(db, seen_within_s=settings.worker_alive_s)}
    for n in crud.unclaimed_nodes(db, older_than_s=settings.queue_claim_timeout_s):
        run = db.get(Run, n.run_id)
        if run is None:
            continue
        if n.worker not in alive:
            if run.status == "queued" and crud.release(db, run.id):
                out["released"].append(run.id)
            elif run.status == "running" and crud.fail_gang(
                    db, run.id, crud.host_lost_error(n, settings.worker_alive_s, None)):
                out["failed"].append(run.id)
        elif n.publish_attempts >= settings.queue_claim_attempts:
            if crud.fail_gang(db, run.id, f"node {n.node} of the run, placed on worker "
                              f"{n.worker} ({n.host}), was not claimed after "
                              f"{n.publish_attempts} publications: does that worker consume "
                              f"its own queue (paralab_core/queue.py node_queue)?"):
                out["failed"].append(run.id)
        elif crud.mark_republished(db, n.run_id, n.node, n.publish_attempts):
            try:
                publish(settings, n.run_id, n.node, n.worker)
            except Exception:  # noqa: BLE001 - counted; health says the broker is down
                log.warning("republishing node %d of run %s failed", n.node, n.run_id,
                            exc_info=True)
            out["republished"].append(n.run_id)
    out["unplaceable"] = fail_unplaceable(db, settings)
    place_waiting(db, settings, publish)
    return out
