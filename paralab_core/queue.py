"""The Celery app both sides of the queue use: the backend publishes (runs, nodes), revokes and
checks the broker; the worker consumes. Configured from the Settings both read.

Tasks receive run IDs only (never payloads); the worker fetches the spec when it claims the
run. Long jobs: late acks, prefetch 1, and a Redis visibility timeout longer than the longest
allowed job, so a message is never redelivered while its job is still legitimately running.
"""

from __future__ import annotations

import re
import socket

from celery import Celery

from paralab_core.config import Settings

TASK_NAME = "paralab.run"
# One node of a multi-host run (backend/services/placement.py), sent to the placed worker's
# own queue: args (run ID, node index), never a payload.
NODE_TASK_NAME = "paralab.node"


def node_queue(worker: str) -> str:
    """The queue only this worker consumes (beside its pool's queue)."""
    return "node." + re.sub(r"[^A-Za-z0-9_.-]", "_", worker)


def worker_host(settings: Settings) -> str:
    return settings.worker_host or socket.gethostname()


def worker_name(settings: Settings) -> str:
    """The worker's Celery hostname and the name it reports (`paralab worker` starts it)."""
    return settings.worker_name or f"{settings.queue}@{worker_host(settings)}"


def make_celery(settings: Settings) -> Celery:
    # The modules of the tasks, named, not imported: Celery imports them in the worker process
    # only, so the backend, which publishes by name (TASK_NAME, NODE_TASK_NAME), never loads them.
    app = Celery("paralab", broker=settings.broker_url, backend=settings.result_backend,
                 include=["worker.tasks", "worker.nodes"])
    conf = {
        "task_acks_late": True,
        "worker_prefetch_multiplier": 1,
        "task_default_queue": "default",
        "task_track_started": True,
        "result_expires": 7 * 86400,
        "broker_connection_retry_on_startup": True,
        "broker_connection_timeout": 5,
        "task_publish_retry_policy": {"max_retries": 3, "interval_start": 0.2,
                                      "interval_step": 0.5, "interval_max": 1},
        "worker_hijack_root_logger": False,
        "worker_send_task_events": False,
    }
    if settings.broker_url.startswith("filesystem://"):
        folder = settings.broker_dir
        for sub in ("queue", "processed", "control"):
            (folder / sub).mkdir(parents=True, exist_ok=True)
        # kombu's filesystem transport with atomic writes (paralab_core/fs_transport.py)
        conf["broker_transport"] = "paralab_core.fs_transport:Transport"
        conf["broker_transport_options"] = {
            "data_folder_in": str(folder / "queue"), "data_folder_out": str(folder / "queue"),
            "processed_folder": str(folder / "processed"), "store_processed": False,
            "control_folder": str(folder / "control"),
            "polling_interval": 0.5,
            "wake": settings.broker_wake,  # a publish wakes the consumers (fs_transport.py)
        }
        settings.data_dir.mkdir(parents=True, exist_ok=True)
    else:
        visibility = int(settings.max_job_timeout_s + 3600)
        conf["broker_transport_options"] = {"visibility_timeout": visibility}
        conf["result_backend_transport_options"] = {"visibility_timeout": visibility}
    app.conf.update(conf)
    return app


_apps: dict[tuple, Celery] = {}


def get_celery(settings: Settings) -> Celery:
    """One app per broker configuration (the backend and the tests may hold several)."""
    key = (settings.broker_url, settings.result_backend, str(settings.broker_dir))
    if key not in _apps:
        _apps[key] = make_celery(settings)
    return _apps[key]


def enqueue_run(settings: Settings, run_id: str, queue: str) -> None:
    get_celery(settings).send_task(TASK_NAME, args=[run_id], queue=queue,
                                   task_id=f"run-{run_id}")


def enqueue_node(settings: Settings, run_id: str, node: int, worker: str) -> None:
    get_celery(settings).send_task(NODE_TASK_NAME, args=[run_id, node], queue=node_queue(worker),
                                   task_id=f"run-{run_id}-node{node}")


def revoke_run(settings: Settings, run_id: str) -> None:
    get_celery(settings).control.revoke(f"run-{run_id}")


def broker_ok(settings: Settings) -> tuple[bool, str]:
    if settings.broker_url.startswith("filesystem://"):
        get_celery(settings)  # creates the folders on first use
        folder = settings.broker_dir / "queue"
        return folder.is_dir(), str(folder)
    try:
        with get_celery(settings).connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
        return True, "connected"
    except Exception as exc:  # noqa: BLE001 - reported by /api/health
        return False, str(exc)

