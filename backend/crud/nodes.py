"""The nodes of multi-host runs (run_nodes): reservation, claim, heartbeat, endpoint, outcome,
and the reaper of nodes whose worker went silent. Every state change is one conditional UPDATE,
so a retried or redelivered call changes nothing twice (docs/hosts.md)."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import and_, delete, func, select, update
from sqlalchemy.orm import Session, defer

from backend.crud.log_lines import line_time, rank_of
from backend.models import FINISHED, NODE_ACTIVE, Run, RunLog, RunNode, utcnow

# The run-level error of a multi-host run one of whose hosts stopped reporting. Not the
# reaper's "worker lost: " prefix: a late report of the surviving nodes must not replace it.
HOST_LOST_PREFIX = "host lost: "


def nodes_of(db: Session, run_id: str) -> list[RunNode]:
    return list(db.scalars(select(RunNode).where(RunNode.run_id == run_id)
                           .order_by(RunNode.node)))


def active_nodes(db: Session) -> list[RunNode]:
    """Nodes that hold their worker's capacity: reserved or running."""
    return list(db.scalars(select(RunNode).where(RunNode.status.in_(NODE_ACTIVE))))


def waiting_gang_runs(db: Session) -> list[Run]:
    """Queued multi-host runs without a placement, oldest first (the order they are placed)."""
    placed = select(RunNode.run_id).where(RunNode.status.in_(NODE_ACTIVE))
    return list(db.scalars(select(Run).options(defer(Run.summary), defer(Run.provenance))
                           .where(Run.status == "queued", Run.nnodes > 1,
                                  Run.cancel_requested.is_(False), Run.id.not_in(placed))
                           .order_by(Run.created_at, Run.id)))


def reserve(db: Session, run_id: str, picks: list[tuple[str, str]], ranks: int) -> None:
    """One row per node, in the caller's transaction (placement commits or rolls back all)."""
    now = utcnow()
    db.execute(delete(RunNode).where(RunNode.run_id == run_id))  # an earlier, released one
    db.add_all(RunNode(run_id=run_id, node=i, worker=w, host=h, ranks=ranks, status="reserved",
                       reserved_at=now, publish_attempts=1) for i, (w, h) in enumerate(picks))


def release(db: Session, run_id: str) -> bool:
    """Drop a placement none of whose nodes started (its run is still queued): it is placed
    again, elsewhere. False when a node has started meanwhile."""
    res = db.execute(delete(RunNode).where(
        RunNode.run_id == run_id,
        ~select(RunNode.node).where(RunNode.run_id == run_id,
                                    RunNode.status != "reserved").exists()))
    db.commit()
    return res.rowcount > 0


def unclaimed_nodes(db: Session, *, older_than_s: float) -> list[RunNode]:
    cutoff = utcnow() - timedelta(seconds=older_than_s)
    return list(db.scalars(select(RunNode).where(RunNode.status == "reserved",
                                                 RunNode.reserved_at < cutoff)))


def mark_republished(db: Session, run_id: str, node: int, attempts: int) -> bool:
    res = db.execute(update(RunNode).where(
        RunNode.run_id == run_id, RunNode.node == node, RunNode.status == "reserved",
        RunNode.publish_attempts == attempts).values(publish_attempts=attempts + 1,
                                                      reserved_at=utcnow()))
    db.commit()
    return res.rowcount == 1


def claim_node(db: Session, run_id: str, node: int, *, worker: str,
               task_id: str | None) -> tuple[bool, str]:
    """reserved -> running for this node, atomically (a redelivered message never launches a
    node twice), and the run queued -> running with its first node."""
    now = utcnow()
    run = db.get(Run, run_id)
    if run is None:
        return False, "no such run"
    if run.cancel_requested or run.status in FINISHED:
        db.execute(update(RunNode).where(RunNode.run_id == run_id, RunNode.node == node,
                                         RunNode.status == "reserved")
                   .values(status="cancelled", finished_at=now))
        db.commit()
        return False, f"run is {run.status}"
    res = db.execute(update(RunNode).where(
        RunNode.run_id == run_id, RunNode.node == node, RunNode.status == "reserved",
        RunNode.worker == worker).values(status="running", started_at=now, heartbeat_at=now,
                                         task_id=task_id))
    if res.rowcount != 1:
        db.rollback()
        row = db.get(RunNode, (run_id, node))
        if row is None:
            return False, f"node {node} is not placed"
        if row.worker != worker:
            return False, f"node {node} is placed on {row.worker}, not {worker}"
        return False, f"node {node} is {row.status}, not reserved"
    db.execute(update(Run).where(Run.id == run_id, Run.status == "queued").values(
        status="running", started_at=now, heartbeat_at=now, worker_host=worker,
        task_id=task_id))
    db.commit()
    return True, "claimed"


def node_heartbeat(db: Session, run_id: str, node: int) -> tuple[Run | None, RunNode | None]:
    now = utcnow()
    db.execute(update(RunNode).where(RunNode.run_id == run_id, RunNode.node == node,
                                     RunNode.status == "running").values(heartbeat_at=now))
    db.execute(update(Run).where(Run.id == run_id, Run.status == "running")
               .values(heartbeat_at=now))
    db.commit()
    return db.get(Run, run_id), db.get(RunNode, (run_id, node))


def set_endpoint(db: Session, run_id: str, node: int, endpoint: str) -> bool:
    res = db.execute(update(RunNode).where(RunNode.run_id == run_id, RunNode.node == node,
                                           RunNode.status == "running")
                     .values(endpoint=endpoint))
    db.commit()
    return res.rowcount == 1


def finish_node(db: Session, run_id: str, node: int, *, status: str, exit_code: int | None,
                error: str | None) -> RunNode | None:
    """running -> how the node ended (idempotent: a retried report changes nothing)."""
    assert status in FINISHED, status
    db.execute(update(RunNode).where(RunNode.run_id == run_id, RunNode.node == node,
                                     RunNode.status == "running")
               .values(status=status, exit_code=exit_code, error=error, finished_at=utcnow()))
    db.commit()
    return db.get(RunNode, (run_id, node))


def cancel_reserved(db: Session, run_id: str) -> None:
    """A queued multi-host run is cancelled: its reservations free their hosts at once."""
    db.execute(update(RunNode).where(RunNode.run_id == run_id, RunNode.status == "reserved")
               .values(status="cancelled", finished_at=utcnow()))


def fail_gang(db: Session, run_id: str, error: str) -> bool:
    """The run fails now, and every node still running is told to stop (its heartbeat answers
    cancel); reserved nodes never start."""
    now = utcnow()
    res = db.execute(update(Run).where(Run.id == run_id, Run.status.in_(("queued", "running")))
                     .values(status="failed", finished_at=now, error=error,
                             cancel_requested=True))
    cancel_reserved(db, run_id)
    db.commit()
    return res.rowcount == 1


def reap_lost_nodes(db: Session, *, timeout_s: float) -> list[tuple[str, int, str]]:
    """Running nodes whose worker has been silent for `timeout_s` are `lost`, and their run
    fails as "host X lost" (the other nodes stop at their next heartbeat). Returns
    (run_id, node, host) of each node reaped."""
    cutoff = utcnow() - timedelta(seconds=timeout_s)
    lost = list(db.scalars(select(RunNode).where(RunNode.status == "running",
                                                 RunNode.heartbeat_at < cutoff)))
    out = []
    for n in lost:
        res = db.execute(update(RunNode).where(RunNode.run_id == n.run_id,
                                               RunNode.node == n.node,
                                               RunNode.status == "running",
                                               RunNode.heartbeat_at < cutoff)
                         .values(status="lost", finished_at=utcnow(),
                                 error=f"no heartbeat from worker {n.worker} for more than "
                                       f"{timeout_s:g} s"))
        if res.rowcount != 1:
            continue
        db.commit()
        fail_gang(db, n.run_id, host_lost_error(n, timeout_s, n.heartbeat_at))
        out.append((n.run_id, n.node, n.host))
    db.commit()
    return out


def host_lost_error(n: RunNode, timeout_s: float, last: datetime | None) -> str:
    seen = f"; last heartbeat {last.isoformat()}" if last else "; it never started"
    return (f"{HOST_LOST_PREFIX}{n.host} (node {n.node}, worker {n.worker}): no heartbeat for "
            f"more than {timeout_s:g} s (worker killed, host down or unreachable){seen}; "
            "every other node was stopped")


def append_node_logs(db: Session, run_id: str, node: int, lines: list[dict],
                     out: list | None = None, problems: list | None = None) -> int:
    """A node's log lines get run-wide `seq`s in arrival order, so the run's log stays one
    contiguous sequence (backend/streams.py) whichever host wrote a line. Idempotent on
    (run_id, node, nseq): a retried batch adds nothing. The run's row lock (PostgreSQL) or the
    write lock (SQLite, BEGIN IMMEDIATE) makes the next `seq` one process's decision.
    `out` and `problems` as crud.append_logs."""
    if not lines:
        return 0
    if db.get_bind().dialect.name == "sqlite":
        db.commit()
        db.connection().exec_driver_sql("BEGIN IMMEDIATE")
    else:
        db.execute(select(Run.id).where(Run.id == run_id).with_for_update())
    row = db.get(RunNode, (run_id, node))
    # every line says where it came from, whoever reads it (text log, live stream, page);
    # its rank is read from the job's own prefix behind the tag
    tag = f"[{row.host if row else '?'} node{node}] "
    want = {}
    for i, x in enumerate(lines):  # a seq twice in one batch: the first one counts
        want.setdefault(int(x["seq"]), (i, x))
    have = set(db.scalars(select(RunLog.nseq).where(
        and_(RunLog.run_id == run_id, RunLog.node == node, RunLog.nseq.in_(list(want))))))
    nxt = (db.scalar(select(func.max(RunLog.seq)).where(RunLog.run_id == run_id)) or -1) + 1
    rows, why, now = [], [], utcnow()
    for nseq in sorted(set(want) - have):
        i, x = want[nseq]
        ts, problem = line_time(x.get("ts"), now)
        if problem:
            why.append((i, "ts", problem))
        rows.append(RunLog(run_id=run_id, seq=nxt, node=node, nseq=nseq,
                           rank=rank_of(x["line"]), line=(tag + x["line"])[:65536], ts=ts))
        nxt += 1
    db.add_all(rows)
    db.commit()
    if out is not None:
        out += [(r.seq, r.rank, r.line) for r in rows]
    if problems is not None:
        problems += sorted(why)
    return len(rows)
