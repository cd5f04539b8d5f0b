"""Every read and write of the database, one module per resource. Routes and services call one
function here and return; `from backend import crud; crud.get_run(...)` reaches them all."""

from backend.crud.audit import audit, list_audit
from backend.crud.cluster import count_queued, queued_runs, running_runs
from backend.crud.collective_sweeps import (
    collective_sweeps,
    latest_compute_calibration,
    latest_sweep,
)
from backend.crud.history import (
    create_comparison,
    delete_comparison,
    get_comparison,
    list_comparisons,
    set_star,
    starred_ids,
    stars_of,
)
from backend.crud.nodes import (
    HOST_LOST_PREFIX,
    active_nodes,
    append_node_logs,
    cancel_reserved,
    claim_node,
    fail_gang,
    finish_node,
    host_lost_error,
    mark_republished,
    node_heartbeat,
    nodes_of,
    reap_lost_nodes,
    release,
    reserve,
    set_endpoint,
    unclaimed_nodes,
    waiting_gang_runs,
)
from backend.crud.runs import (
    SORT_KEYS,
    RunFilter,
    append_logs,
    claim,
    create_imported,
    create_run,
    decode_cursor,
    delete_run,
    fail_unclaimed,
    finish,
    get_run,
    heartbeat,
    list_files,
    list_runs,
    log_page,
    logs_after,
    mark_enqueued,
    new_run_id,
    reap_lost_runs,
    record_file,
    request_cancel,
    run_status,
    unclaimed_runs,
)
from backend.crud.sweeps import (
    SweepFilter,
    create_sweep,
    get_sweep,
    list_sweeps,
    sweep_of_run,
    sweep_status,
)
from backend.crud.tokens import (
    create_credential,
    list_tokens,
    lookup_credential,
    revoke_credential,
)
from backend.crud.uploads import create_upload, get_upload, uploaded_bytes
from backend.crud.users import (
    LOCAL_USERNAME,
    create_user,
    get_user,
    list_users,
    local_user,
    set_password,
    update_user,
)
from backend.crud.workers import (
    list_rejections,
    list_workers,
    record_rejection,
    upsert_worker,
)

__all__ = [
    "LOCAL_USERNAME", "SORT_KEYS", "RunFilter", "append_logs", "audit", "claim",
    "create_comparison", "delete_comparison", "get_comparison", "list_comparisons", "set_star",
    "starred_ids", "stars_of",
    "create_credential", "create_imported",
    "create_run", "create_user", "decode_cursor", "delete_run", "finish",
    "get_run", "get_user", "heartbeat", "latest_sweep", "list_audit", "list_files", "list_runs",
    "latest_compute_calibration",
    "list_tokens", "list_users", "list_workers", "local_user", "log_page", "logs_after",
    "run_status",
    "lookup_credential", "new_run_id", "reap_lost_runs", "record_file", "request_cancel",
    "revoke_credential", "set_password", "collective_sweeps", "update_user", "upsert_worker",
    # the reconciler and health (backend/services/reconcile.py, health.py)
    "fail_unclaimed", "list_rejections", "mark_enqueued", "record_rejection", "unclaimed_runs",
    # the cluster page (backend/services/cluster.py)
    "count_queued", "queued_runs", "running_runs",
    # multi-host runs (backend/services/placement.py, the worker channel's node calls)
    "HOST_LOST_PREFIX", "active_nodes", "append_node_logs", "cancel_reserved", "claim_node",
    "fail_gang", "finish_node", "host_lost_error", "mark_republished", "node_heartbeat", "nodes_of",
    "reap_lost_nodes", "release", "reserve", "set_endpoint", "unclaimed_nodes",
    "waiting_gang_runs",
    # sweeps (backend/services/sweeps.py)
    "SweepFilter", "create_sweep", "get_sweep", "list_sweeps", "sweep_of_run", "sweep_status",
    # uploaded working directories (backend/services/uploads.py)
    "create_upload", "get_upload", "uploaded_bytes",
]
