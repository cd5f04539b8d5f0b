"""Response shapes of GET /api/cluster (backend/services/cluster.py builds the answer)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field


class ClusterDevice(BaseModel):
    type: str = Field(description="cuda or cpu")
    name: str
    index: int | None
    memory_bytes: int | None
    worker: str = Field(description="the worker that reports it")


class ClusterWorker(BaseModel):
    name: str
    queue: str
    slots: int
    busy: int
    free: int
    last_seen: datetime


class ClusterRun(BaseModel):
    id: str
    name: str
    owner: str
    queue: str
    world_size: int
    worker: str | None = Field(description="the worker that claimed it")
    started_at: datetime | None
    running_s: float | None


class ClusterHold(BaseModel):
    run: str
    node: int
    ranks: int
    status: str = Field(description="reserved (its worker not started yet) or running")
    worker: str


class ClusterPlaced(BaseModel):
    node: int
    host: str
    worker: str


class ClusterHost(BaseModel):
    host: str
    queues: list[str]
    slots: int
    busy: int
    free: int
    devices: list[ClusterDevice]
    workers: list[ClusterWorker]
    runs: list[ClusterRun] = Field(description="runs running on this host's workers")
    held_by: list[ClusterHold] = Field(description="the nodes of multi-host runs holding this "
                                       "host's ranks, reserved or running (gang placement)")


class ClusterQueue(BaseModel):
    queue: str
    hosts: list[str]
    workers: int
    slots: int
    busy: int
    free: int
    queued: int


class ClusterQueued(BaseModel):
    id: str
    name: str
    owner: str
    queue: str
    world_size: int
    nnodes: int
    waiting_since: datetime
    waited_s: float
    reason: str = Field(description="why it has not started, in words")
    placement: list[ClusterPlaced] = Field(description="the hosts reserved for its nodes once "
                                           "it is placed (multi-host runs)")


class ClusterOut(BaseModel):
    hosts: list[ClusterHost]
    queues: list[ClusterQueue]
    queued: list[ClusterQueued] = Field(description="oldest first, at most 500")
    queued_total: int
    running_unseen: list[ClusterRun] = Field(
        description="running runs whose worker has not reported recently (worker lost?)")
    worker_alive_s: float
    generated_at: datetime
