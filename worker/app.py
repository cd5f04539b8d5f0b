"""The worker's Celery app, `celery -A worker.app:celery_app worker` (`paralab worker` starts
the same one). Its configuration, the task names and the publishing side live in
paralab_core/queue.py, which the backend uses too; they are re-exported here."""

from __future__ import annotations

from paralab_core.config import get_settings
from paralab_core.queue import (
    NODE_TASK_NAME,
    TASK_NAME,
    broker_ok,
    enqueue_node,
    enqueue_run,
    get_celery,
    make_celery,
    node_queue,
    revoke_run,
)

__all__ = ["NODE_TASK_NAME", "TASK_NAME", "broker_ok", "enqueue_node", "enqueue_run",
           "get_celery", "make_celery", "node_queue", "revoke_run"]


def __getattr__(name: str):
    # built on first use, not at import, so importing this module creates no folders and opens
    # no connections
    if name == "celery_app":
        return get_celery(get_settings())
    raise AttributeError(name)
