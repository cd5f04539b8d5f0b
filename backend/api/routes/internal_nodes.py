"""The worker channel's calls for the nodes of a multi-host run (docs/hosts.md): each placed
worker claims its node, publishes (node 0) or reads the rendezvous endpoint, beats, ships its
log lines (the backend gives them run-wide sequence numbers) and reports how its node ended.
Node 0's worker also lists the files the other nodes uploaded, to analyse the whole run.
Served as the rest of the channel is (internal.py: threads of its own)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path
from pydantic import Field

from backend import crud
from backend.api.routes.internal import (
    ChannelChecks,
    ChannelSettings,
    ChannelWorker,
    in_channel,
    log_answer,
)
from backend.api.schemas import (
    INT32_MAX,
    ClaimIn,
    ExitCode,
    Input,
    LogBatch,
    LogBatchOut,
)
from backend.errors import NotFound
from backend.services import placement
from backend.streams import hub

router = APIRouter(prefix="/api/internal", tags=["worker channel"], dependencies=[ChannelChecks])

# run_nodes.node is an INTEGER: a larger one is a 422 naming it, never a query that overflows
Node = Annotated[int, Path(ge=0, le=INT32_MAX, description="the node's index (0 .. nnodes-1)")]


class EndpointIn(Input):
    # (not SafeStr: its text pattern would replace this one in the schema; this one, ASCII
    # only, holds no NUL or lone surrogate anyway)
    endpoint: str = Field(max_length=300, pattern=r"^[A-Za-z0-9_.:\[\]-]+:[0-9]{1,5}$",
                          description="host:port where node 0 serves the rendezvous")


class NodeFinishIn(Input):
    status: str = Field(pattern="^(succeeded|failed|cancelled|timed_out|hung)$")
    exit_code: ExitCode | None = None
    error: str | None = Field(None, max_length=20_000)


def _node(db, run, node: int):
    row = next((n for n in crud.nodes_of(db, run.id) if n.node == node), None)
    if row is None:
        raise NotFound(f"run {run.id} has no node {node}")
    return row


def _claim_node(db, run, node: int, body: ClaimIn) -> dict:
    ok, reason = crud.claim_node(db, run.id, node, worker=body.worker, task_id=body.task_id)
    if ok:
        hub.publish_status(run.id, "running")
    return {"launch": ok, "reason": reason, "spec": run.spec if ok else None,
            "nnodes": run.nnodes, "nodes": placement.node_view(db, run.id)}


@router.post("/runs/{run_id}/nodes/{node}/claim")
async def claim_node(run_id: str, node: Node, body: ClaimIn, settings: ChannelSettings,
                     _: ChannelWorker) -> dict:
    return await in_channel(settings, run_id, _claim_node, node, body)


def _node_heartbeat(db, run, node: int) -> dict:
    run, row = crud.node_heartbeat(db, run.id, node)
    if row is None:
        raise NotFound(f"run {run.id} has no node {node}")
    # a run that already ended (another node's host lost, a failure reported) stops them all
    stop = run.cancel_requested or run.status not in ("queued", "running")
    return {"status": run.status, "cancel": stop, "node_status": row.status}


@router.post("/runs/{run_id}/nodes/{node}/heartbeat")
async def node_heartbeat(run_id: str, node: Node, settings: ChannelSettings,
                         _: ChannelWorker) -> dict:
    return await in_channel(settings, run_id, _node_heartbeat, node)


def _set_endpoint(db, run, node: int, body: EndpointIn) -> dict:
    _node(db, run, node)
    return {"set": crud.set_endpoint(db, run.id, node, body.endpoint)}


@router.put("/runs/{run_id}/nodes/{node}/endpoint")
async def set_endpoint(run_id: str, node: Node, body: EndpointIn, settings: ChannelSettings,
                       _: ChannelWorker) -> dict:
    return await in_channel(settings, run_id, _set_endpoint, node, body)


def _list_nodes(db, run) -> dict:
    return {"status": run.status, "cancel": run.cancel_requested,
            "nodes": placement.node_view(db, run.id)}


@router.get("/runs/{run_id}/nodes")
async def list_nodes(run_id: str, settings: ChannelSettings, _: ChannelWorker) -> dict:
    return await in_channel(settings, run_id, _list_nodes)


def _node_logs(db, run, node: int, body: LogBatch) -> dict:
    _node(db, run, node)
    new, problems = [], []
    added = crud.append_node_logs(db, run.id, node, [x.model_dump() for x in body.lines],
                                  out=new, problems=problems)
    hub.publish_lines(run.id, sorted(new))
    return log_answer(added, problems)


@router.post("/runs/{run_id}/nodes/{node}/logs", response_model=LogBatchOut,
             response_model_exclude_none=True)
async def node_logs(run_id: str, node: Node, body: LogBatch, settings: ChannelSettings,
                    _: ChannelWorker) -> dict:
    """As POST .../logs; the backend numbers the node's lines into the run's one sequence."""
    return await in_channel(settings, run_id, _node_logs, node, body)


def _finish_node(db, run, node: int, body: NodeFinishIn, settings) -> dict:
    _node(db, run, node)
    row = crud.finish_node(db, run.id, node, status=body.status, exit_code=body.exit_code,
                           error=body.error)
    if row.status != "succeeded" and run.status == "running":
        # a node that did not succeed ends the run: the others stop at their next heartbeat,
        # and node 0 reports the run's outcome from every node's
        crud.request_cancel(db, run)
    placement.place_waiting(db, settings)  # its host is free: the next gang may fit now
    return {"status": row.status}


@router.post("/runs/{run_id}/nodes/{node}/finish")
async def finish_node(run_id: str, node: Node, body: NodeFinishIn, _: ChannelWorker,
                      settings: ChannelSettings) -> dict:
    return await in_channel(settings, run_id, _finish_node, node, body, settings)


def _list_files(db, run) -> dict:
    return {"files": [{"path": f.path, "size": f.size, "sha256": f.sha256}
                      for f in crud.list_files(db, run.id)]}


@router.get("/runs/{run_id}/files")
async def list_files(run_id: str, settings: ChannelSettings, _: ChannelWorker) -> dict:
    return await in_channel(settings, run_id, _list_files)
