"""The worker channel's calls for the nodes of a multi-host run (docs/hosts.md): each placed
worker claims its node, publishes (node 0) or reads the rendezvous endpoint, beats, ships its
log lines (the backend gives them run-wide sequence numbers) and reports how its node ended.
Node 0's worker also lists the files the other nodes uploaded, to analyse the whole run."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import Field

from backend import crud
from backend.api.deps import CheckedParams, DbDep, RunDep, SettingsDep, WorkerDep
from backend.api.schemas import ClaimIn, Input, JsonInt, LogBatch, SafeStr
from backend.errors import NotFound
from backend.services import placement
from backend.streams import hub

router = APIRouter(prefix="/api/internal", tags=["worker channel"], dependencies=[CheckedParams])

class EndpointIn(Input):
    endpoint: SafeStr = Field(max_length=300, pattern=r"^[A-Za-z0-9_.:\[\]-]+:\d{1,5}$")


class NodeFinishIn(Input):
    status: str = Field(pattern="^(succeeded|failed|cancelled|timed_out|hung)$")
    exit_code: JsonInt | None = Field(None, ge=-(2**31), le=2**31 - 1)
    error: str | None = Field(None, max_length=20_000)


def _node(db, run, node: int):
    row = next((n for n in crud.nodes_of(db, run.id) if n.node == node), None)
    if row is None:
        raise NotFound(f"run {run.id} has no node {node}")
    return row


@router.post("/runs/{run_id}/nodes/{node}/claim")
def claim_node(db: DbDep, run: RunDep, node: int, body: ClaimIn, _: WorkerDep) -> dict:
    ok, reason = crud.claim_node(db, run.id, node, worker=body.worker, task_id=body.task_id)
    if ok:
        hub.publish_status(run.id, "running")
    return {"launch": ok, "reason": reason, "spec": run.spec if ok else None,
            "nnodes": run.nnodes, "nodes": placement.node_view(db, run.id)}


@router.post("/runs/{run_id}/nodes/{node}/heartbeat")
def node_heartbeat(db: DbDep, run: RunDep, node: int, _: WorkerDep) -> dict:
    run, row = crud.node_heartbeat(db, run.id, node)
    if row is None:
        raise NotFound(f"run {run.id} has no node {node}")
    # a run that already ended (another node's host lost, a failure reported) stops them all
    stop = run.cancel_requested or run.status not in ("queued", "running")
    return {"status": run.status, "cancel": stop, "node_status": row.status}


@router.put("/runs/{run_id}/nodes/{node}/endpoint")
def set_endpoint(db: DbDep, run: RunDep, node: int, body: EndpointIn, _: WorkerDep) -> dict:
    _node(db, run, node)
    return {"set": crud.set_endpoint(db, run.id, node, body.endpoint)}


@router.get("/runs/{run_id}/nodes")
def list_nodes(db: DbDep, run: RunDep, _: WorkerDep) -> dict:
    return {"status": run.status, "cancel": run.cancel_requested,
            "nodes": placement.node_view(db, run.id)}


@router.post("/runs/{run_id}/nodes/{node}/logs")
def node_logs(db: DbDep, run: RunDep, node: int, body: LogBatch, _: WorkerDep) -> dict:
    _node(db, run, node)
    new: list = []
    added = crud.append_node_logs(db, run.id, node, [x.model_dump() for x in body.lines],
                                  out=new)
    hub.publish_lines(run.id, sorted(new))
    return {"added": added}


@router.post("/runs/{run_id}/nodes/{node}/finish")
def finish_node(db: DbDep, run: RunDep, node: int, body: NodeFinishIn, _: WorkerDep,
                settings: SettingsDep) -> dict:
    _node(db, run, node)
    row = crud.finish_node(db, run.id, node, status=body.status, exit_code=body.exit_code,
                           error=body.error)
    if row.status != "succeeded" and run.status == "running":
        # a node that did not succeed ends the run: the others stop at their next heartbeat,
        # and node 0 reports the run's outcome from every node's
        crud.request_cancel(db, run)
    placement.place_waiting(db, settings)  # its host is free: the next gang may fit now
    return {"status": row.status}


@router.get("/runs/{run_id}/files")
def list_files(db: DbDep, run: RunDep, _: WorkerDep) -> dict:
    return {"files": [{"path": f.path, "size": f.size, "sha256": f.sha256}
                      for f in crud.list_files(db, run.id)]}
