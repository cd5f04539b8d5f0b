"""The cluster as the page /cluster shows it (GET /api/cluster): live hosts grouped from the
workers' heartbeats, their devices and slots, the runs running on each, and the queued runs
with the reason each one waits.

A host is the `host` a worker reports (PARALAB_WORKER_HOST, else its machine's hostname):
several workers may share one (one per GPU group, or one per queue). A run is on the host of
the worker that claimed it (`Run.worker_host` holds the claiming worker's name). Multi-host
run spans several hosts (runtime.nnodes > 1): it is on each host one of its nodes is placed on
(run_nodes), and `held_by` lists the multi-host runs holding a host's ranks, reserved or running;
a queued multi-host run's `placement` is its reserved nodes and its reason is the placer's
(backend/services/placement.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from backend import crud
from backend.core.config import Settings
from backend.models import Run, Worker, utcnow
from backend.services import placement


@dataclass
class QueueStats:
    """What one queue's live workers offer, as wait_reason needs it."""

    queue: str
    workers: int = 0
    hosts: set[str] = field(default_factory=set)
    slots: int = 0
    busy: int = 0
    # the most CUDA devices one live host of the queue reports (0: CPU hosts, no limit)
    max_gpus_per_host: int = 0

    @property
    def free(self) -> int:
        return max(self.slots - self.busy, 0)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def wait_reason(q: QueueStats, *, nnodes: int, ranks_per_host: int, ahead: int,
                waited_s: float, attempts: int, claim_timeout_s: float,
                claim_attempts: int) -> str:
    """Why a queued run has not started, in words: the first of these that holds.

    no live worker on its queue; more hosts than the queue has (a gang run); more ranks per
    host than the largest GPU host has GPUs; every slot busy; earlier runs of the queue
    take the free slots; a free slot no worker claimed within the claim bound (the
    reconciler is on it); else a free slot the worker is about to take."""
    name = repr(q.queue)
    if q.workers == 0:
        return (f"no live worker serves queue {name}: start one with PARALAB_QUEUE={q.queue} "
                "(docs/deploy.md, adding a GPU host)")
    if nnodes > len(q.hosts):
        return (f"needs {_plural(nnodes, 'host')} at once; queue {name} has "
                f"{_plural(len(q.hosts), 'live host')}")
    if q.max_gpus_per_host and ranks_per_host > q.max_gpus_per_host:
        return (f"needs {ranks_per_host} GPUs on one host (nproc_per_node); the largest "
                f"live host of queue {name} has {q.max_gpus_per_host}")
    if q.free == 0:
        return (f"every slot of queue {name} is busy ({q.busy} of {q.slots}, on "
                f"{', '.join(sorted(q.hosts))}): it starts when one frees")
    if ahead >= q.free:
        return (f"behind {_plural(ahead, 'earlier run')} of queue {name} for its "
                f"{_plural(q.free, 'free slot')}")
    if waited_s > claim_timeout_s:
        return (f"a slot of queue {name} is free but no worker claimed the run in "
                f"{waited_s:.0f} s (published {attempts} of {claim_attempts} times; the "
                "reconciler publishes it again, then fails it with the reason)")
    return f"a slot of queue {name} is free: the worker is about to claim it"


def why_queued(db: Session, settings: Settings, run: Run) -> str | None:
    """The reason the cluster page gives for this one queued run (None: it is not queued):
    the placer's for a multi-host run, else wait_reason over its queue's live workers and
    the one-host runs queued before it. The run page shows it (GET /api/runs/{id})."""
    if run.status != "queued":
        return None
    nnodes, per_host = _runtime(run)
    if nnodes > 1:
        return placement.why_waiting(db, settings, run)
    now = utcnow()
    stats = queue_stats(crud.list_workers(db, seen_within_s=settings.worker_alive_s))
    ahead = db.scalar(select(func.count()).select_from(Run).where(
        Run.status == "queued", Run.cancel_requested.is_(False), Run.nnodes == 1,
        Run.queue == run.queue, Run.created_at < run.created_at)) or 0
    waited = (now - run.created_at).total_seconds()
    return wait_reason(stats.get(run.queue) or QueueStats(run.queue), nnodes=1,
                       ranks_per_host=per_host, ahead=ahead, waited_s=waited,
                       attempts=run.enqueue_attempts,
                       claim_timeout_s=settings.queue_claim_timeout_s,
                       claim_attempts=settings.queue_claim_attempts)


def queue_stats(workers: Iterable[Worker]) -> dict[str, QueueStats]:
    out: dict[str, QueueStats] = {}
    gpus: dict[tuple[str, str], int] = {}
    for w in workers:
        q = out.setdefault(w.queue, QueueStats(w.queue))
        q.workers += 1
        q.hosts.add(w.host)
        q.slots += w.slots
        q.busy += min(w.busy, w.slots)
        key = (w.queue, w.host)
        gpus[key] = gpus.get(key, 0) + sum(1 for d in w.devices if d.get("type") == "cuda")
    for (queue, _), n in gpus.items():
        out[queue].max_gpus_per_host = max(out[queue].max_gpus_per_host, n)
    return out


def _devices(workers: list[Worker]) -> list[dict]:
    """A host's devices: each worker's, except that workers on one machine report its CPU
    once each (the same device)."""
    out, seen = [], set()
    for w in workers:
        for d in w.devices:
            if d.get("type") == "cpu":
                key = (d.get("name"), d.get("cores"), d.get("memory_bytes"))
                if key in seen:
                    continue
                seen.add(key)
            out.append({"type": str(d.get("type") or "?"), "name": str(d.get("name") or "?"),
                        "index": d.get("index") if isinstance(d.get("index"), int) else None,
                        "memory_bytes": d.get("memory_bytes")
                        if isinstance(d.get("memory_bytes"), int) else None,
                        "worker": w.name})
    return out


def _run_brief(run: Run, now) -> dict:
    return {"id": run.id, "name": run.name, "owner": run.owner, "queue": run.queue,
            "world_size": run.world_size, "worker": run.worker_host,
            "started_at": run.started_at,
            "running_s": round((now - run.started_at).total_seconds(), 1)
            if run.started_at else None}


def _runtime(run: Run) -> tuple[int, int]:
    rt = (run.spec or {}).get("runtime") or {}
    per_host = rt.get("nproc_per_node")
    return run.nnodes, per_host if isinstance(per_host, int) else run.world_size


def cluster_view(db: Session, settings: Settings) -> dict:
    now = utcnow()
    workers = crud.list_workers(db, seen_within_s=settings.worker_alive_s)
    by_host: dict[str, list[Worker]] = {}
    for w in workers:
        by_host.setdefault(w.host, []).append(w)
    host_of = {w.name: w.host for w in workers}
    running: dict[str, list[dict]] = {}
    unseen = []
    gang: dict[str, list] = {}
    for n in crud.active_nodes(db):
        gang.setdefault(n.run_id, []).append(n)
    held: dict[str, list[dict]] = {}
    for run_id, nodes in gang.items():
        for n in nodes:
            held.setdefault(n.host, []).append({"run": run_id, "node": n.node, "ranks": n.ranks,
                                                "status": n.status, "worker": n.worker})
    for run in crud.running_runs(db):
        if run.nnodes > 1:  # on every host of its nodes
            for host in sorted({n.host for n in gang.get(run.id, [])}):
                running.setdefault(host, []).append(_run_brief(run, now))
            continue
        host = host_of.get(run.worker_host or "")
        if host is None and run.worker_host in by_host:  # a worker that reported its host
            host = run.worker_host
        (running.setdefault(host, []) if host else unseen).append(_run_brief(run, now))
    hosts = []
    for host, ws in sorted(by_host.items()):
        slots = sum(w.slots for w in ws)
        busy = sum(min(w.busy, w.slots) for w in ws)
        hosts.append({
            "host": host, "queues": sorted({w.queue for w in ws}),
            "slots": slots, "busy": busy, "free": slots - busy,
            "devices": _devices(ws), "runs": running.get(host, []),
            "held_by": held.get(host, []),
            "workers": [{"name": w.name, "queue": w.queue, "slots": w.slots, "busy": w.busy,
                         "free": max(w.slots - w.busy, 0), "last_seen": w.last_seen}
                        for w in ws]})
    stats = queue_stats(workers)
    queued = []
    ahead: dict[str, int] = {}
    ahead_one: dict[str, int] = {}
    for run in crud.queued_runs(db):
        nnodes, per_host = _runtime(run)
        waited = (now - run.created_at).total_seconds()
        queued.append({
            "id": run.id, "name": run.name, "owner": run.owner, "queue": run.queue,
            "world_size": run.world_size, "nnodes": nnodes, "waiting_since": run.created_at,
            "waited_s": round(waited, 1),
            "placement": [{"node": n.node, "host": n.host, "worker": n.worker}
                          for n in gang.get(run.id, [])],
            "reason": placement.why_waiting(db, settings, run) if nnodes > 1 else wait_reason(
                stats.get(run.queue) or QueueStats(run.queue), nnodes=nnodes,
                ranks_per_host=per_host, ahead=ahead_one.get(run.queue, 0), waited_s=waited,
                attempts=run.enqueue_attempts, claim_timeout_s=settings.queue_claim_timeout_s,
                claim_attempts=settings.queue_claim_attempts)})
        ahead[run.queue] = ahead.get(run.queue, 0) + 1
        if nnodes == 1:  # multi-host runs are placed by the placer, not taken by a slot
            ahead_one[run.queue] = ahead_one.get(run.queue, 0) + 1
    names = sorted(set(stats) | set(ahead))
    queues = [{"queue": n, "hosts": sorted(stats[n].hosts) if n in stats else [],
               "workers": stats[n].workers if n in stats else 0,
               "slots": stats[n].slots if n in stats else 0,
               "busy": stats[n].busy if n in stats else 0,
               "free": stats[n].free if n in stats else 0,
               "queued": ahead.get(n, 0)} for n in names]
    return {"hosts": hosts, "queues": queues, "queued": queued,
            "queued_total": crud.count_queued(db), "running_unseen": unseen,
            "worker_alive_s": settings.worker_alive_s, "generated_at": now}
