"""The worker's channel to the backend: HTTP with the worker credential, retried with backoff
so a backend restart or a network blip delays a report but never loses it."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import httpx

log = logging.getLogger(__name__)


class BackendUnavailable(RuntimeError):
    pass


class BackendClient:
    def __init__(self, base_url: str, token: str, *, timeout: float = 10.0,
                 worker: str | None = None, host: str | None = None):
        # The name and host travel with every call so that a backend refusing the credential
        # can say which worker it refuses (/api/health's worker_auth check).
        headers = {"Authorization": f"Bearer {token}",
                   **({"X-Paralab-Worker": worker} if worker else {}),
                   **({"X-Paralab-Worker-Host": host} if host else {})}
        self._http = httpx.Client(base_url=base_url.rstrip("/"), timeout=timeout,
                                  headers=headers)
        self._reached = False  # has the backend answered a worker heartbeat yet?
        self._hb_failing: str | None = None  # why the worker heartbeats fail, while they do
        self._hb_warned = 0.0

    def close(self) -> None:
        self._http.close()

    def call(self, method: str, path: str, *, retry_for_s: float = 0.0, quiet: bool = False,
             retry_full: bool = True, **kw) -> Any:
        """One request; on connection errors and 5xx retry until `retry_for_s` has passed.
        4xx is a bug or a permanent refusal and is raised at once. 507 (the backend's disk is
        full) is retried only with `retry_full`: log lines and files give way, so that the
        run's outcome (finish, which retries) still gets through."""
        deadline, delay = time.monotonic() + retry_for_s, 0.2
        while True:
            try:
                r = self._http.request(method, path, **kw)
                if r.status_code < 500:
                    r.raise_for_status()
                    return r.json() if r.content else None
                err: Exception = httpx.HTTPStatusError(f"{r.status_code} {r.text[:300]}",
                                                       request=r.request, response=r)
                if r.status_code == 507 and not retry_full:
                    raise BackendUnavailable(f"{method} {path}: {err}") from err
            except httpx.TransportError as exc:
                err = exc
            if time.monotonic() >= deadline:
                raise BackendUnavailable(f"{method} {path}: {err}") from err
            (log.debug if quiet else log.warning)(
                "backend call %s %s failed (%s); retrying in %.1fs", method, path, err, delay)
            time.sleep(delay)
            delay = min(delay * 2, 5.0)

    # -- the calls of the worker channel ----------------------------------------------------
    def claim(self, run_id: str, worker: str, task_id: str | None) -> dict:
        return self.call("POST", f"/api/internal/runs/{run_id}/claim", retry_for_s=600,
                         json={"worker": worker, "task_id": task_id})

    def heartbeat(self, run_id: str) -> dict | None:
        try:
            return self.call("POST", f"/api/internal/runs/{run_id}/heartbeat",
                             retry_for_s=0, timeout=3)
        except BackendUnavailable:
            return None

    def logs(self, run_id: str, lines: list[dict], retry_for_s: float) -> dict:
        """{"added": n} and, when some lines could not be stored as sent, "rejected"."""
        return self.call("POST", f"/api/internal/runs/{run_id}/logs", retry_for_s=retry_for_s,
                         json={"lines": lines}, retry_full=False)

    def upload(self, run_id: str, rel: str, path: Path) -> None:
        """One file, streamed from disk (never whole in memory; a retry reads it again)."""
        self.call("PUT", f"/api/internal/runs/{run_id}/files/{rel}", retry_for_s=1800,
                  content=FileBody(path), timeout=120, retry_full=False,
                  headers={"Content-Length": str(path.stat().st_size)})

    def seal(self, run_id: str, rel: str, size: int) -> None:
        """The backend's live copy of `rel` is the whole file (`size` bytes): record it
        without sending it again. httpx.HTTPStatusError 409 when that copy differs."""
        self.call("POST", f"/api/internal/runs/{run_id}/sealed-files/{rel}", retry_for_s=300,
                  params={"size": size}, retry_full=False)

    def checkpoint_files(self, run_id: str, step: int) -> dict:
        return self.call("GET", f"/api/internal/runs/{run_id}/checkpoints/{step}/files",
                         retry_for_s=300)

    def download(self, run_id: str, rel: str, dest: Path) -> None:
        """One stored file of a run (a checkpoint shard to resume from), written to `dest`
        through a temporary name, so a half-downloaded shard is never read as whole."""
        self._fetch(f"/api/internal/runs/{run_id}/files/{rel}", dest)

    def upload_archive(self, sha256: str, dest: Path) -> None:
        """A working directory's archive (a script run's upload), written to `dest`."""
        self._fetch(f"/api/internal/uploads/{sha256}", dest)

    def _fetch(self, path: str, dest: Path) -> None:
        deadline, delay = time.monotonic() + 600, 0.2
        while True:
            try:
                with self._http.stream("GET", path, timeout=120) as r:
                    r.raise_for_status()
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    tmp = dest.with_name(dest.name + ".part")
                    with open(tmp, "wb") as f:
                        for chunk in r.iter_bytes(1 << 20):
                            f.write(chunk)
                    tmp.replace(dest)
                    return
            except httpx.HTTPStatusError as exc:
                if exc.response.status_code < 500 or time.monotonic() >= deadline:
                    raise
            except httpx.TransportError:
                if time.monotonic() >= deadline:
                    raise
            time.sleep(delay)
            delay = min(delay * 2, 5.0)

    def append(self, run_id: str, rel: str, offset: int, data: bytes) -> None:
        """Bytes a job appended to one of its live files, written at `offset` (idempotent)."""
        self.call("PUT", f"/api/internal/runs/{run_id}/files/{rel}", retry_for_s=0,
                  params={"offset": offset}, content=data, timeout=30, retry_full=False)

    def finish(self, run_id: str, **body) -> dict:
        return self.call("POST", f"/api/internal/runs/{run_id}/finish", retry_for_s=1800,
                         json=body)

    # -- the nodes of a multi-host run (backend/api/routes/internal_nodes.py) -------------------
    def claim_node(self, run_id: str, node: int, worker: str, task_id: str | None) -> dict:
        return self.call("POST", f"/api/internal/runs/{run_id}/nodes/{node}/claim",
                         retry_for_s=600, json={"worker": worker, "task_id": task_id})

    def node_heartbeat(self, run_id: str, node: int) -> dict | None:
        try:
            return self.call("POST", f"/api/internal/runs/{run_id}/nodes/{node}/heartbeat",
                             retry_for_s=0, timeout=3)
        except BackendUnavailable:
            return None

    def set_endpoint(self, run_id: str, node: int, endpoint: str) -> None:
        self.call("PUT", f"/api/internal/runs/{run_id}/nodes/{node}/endpoint", retry_for_s=120,
                  json={"endpoint": endpoint})

    def nodes(self, run_id: str) -> dict:
        return self.call("GET", f"/api/internal/runs/{run_id}/nodes", retry_for_s=60)

    def node_logs(self, run_id: str, node: int, lines: list[dict], retry_for_s: float) -> dict:
        return self.call("POST", f"/api/internal/runs/{run_id}/nodes/{node}/logs",
                         retry_for_s=retry_for_s, json={"lines": lines}, retry_full=False)

    def finish_node(self, run_id: str, node: int, **body) -> dict:
        return self.call("POST", f"/api/internal/runs/{run_id}/nodes/{node}/finish",
                         retry_for_s=1800, json=body)

    def run_files(self, run_id: str) -> list[dict]:
        return self.call("GET", f"/api/internal/runs/{run_id}/files", retry_for_s=300)["files"]

    def worker_heartbeat(self, **body) -> None:
        """Never raises: the heartbeat thread must outlive any answer (a refused credential, a
        backend restart, a full disk), so /api/workers shows this worker again as soon as the
        backend takes its reports. Why it fails is logged, at most once a minute."""
        try:
            self.call("POST", "/api/internal/workers/heartbeat", retry_for_s=0, json=body,
                      timeout=3, quiet=True)
        except Exception as exc:  # noqa: BLE001 - see above
            self._heartbeat_failed(exc)
            return
        if self._hb_failing is not None:
            log.warning("worker heartbeat reaches the backend again (it failed: %s)",
                        self._hb_failing)
        self._reached, self._hb_failing = True, None

    def _heartbeat_failed(self, exc: Exception) -> None:
        cause = exc.__cause__ if isinstance(exc, BackendUnavailable) and exc.__cause__ else exc
        status = getattr(getattr(cause, "response", None), "status_code", None)
        if status == 401:
            why = ("the backend refuses this worker's credential (401): PARALAB_WORKER_TOKEN "
                   "does not match the backend's")
        elif status is not None:
            why = f"the backend answered {cause}"
        else:
            why = f"{type(cause).__name__}: {cause}"
        # `paralab up` starts the worker beside the backend: until the backend has answered
        # once, "connection refused" is the expected state, not a failure worth a warning.
        if status is None and not self._reached:
            log.debug("worker heartbeat failed: %s", why)
            return
        now = time.monotonic()
        if why != self._hb_failing or now - self._hb_warned >= 60:
            log.warning("worker heartbeat failed: %s (retrying every beat)", why)
            self._hb_warned = now
        self._hb_failing = why


class FileBody:
    """A file's bytes for an upload, read chunk by chunk each time it is iterated (httpx
    iterates it once per attempt)."""

    CHUNK = 1 << 20

    def __init__(self, path: Path):
        self.path = path

    def __iter__(self):
        with open(self.path, "rb") as f:
            while chunk := f.read(self.CHUNK):
                yield chunk
