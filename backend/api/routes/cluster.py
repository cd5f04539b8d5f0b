"""The cluster view: hosts, devices, slots, who runs where, and what queued runs wait for."""

from __future__ import annotations

from fastapi import APIRouter

from backend.api.cluster_schemas import ClusterOut
from backend.api.deps import DbDep, SettingsDep
from backend.services.cluster import cluster_view

router = APIRouter(prefix="/api", tags=["meta"])


@router.get("/cluster", response_model=ClusterOut)
def cluster(db: DbDep, settings: SettingsDep) -> dict:
    """Live hosts (grouped from the workers' heartbeats) with their devices, slots and the
    runs running on them; the queued runs, oldest first, each with why it waits."""
    return cluster_view(db, settings)
