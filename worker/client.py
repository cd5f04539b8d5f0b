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
    def __init__(self, base_url: str, token: str, *, timeout: float = 10.0):
        self._http = httpx.Client(base_url=base_url.rstrip("/"), timeout=timeout,
                                  headers={"Authorization": f"Bearer {token}"})
        self._reached = False  # has the backend answered a worker heartbeat yet?

    def close(self) -> None:
        self._http.close()

    def call(self, method: str, path: str, *, retry_for_s: float = 0.0, quiet: bool = False,
             **kw) -> Any:
        """One request; on connection errors and 5xx retry until `retry_for_s` has passed.
        4xx is a bug or a permanent refusal and is raised at once."""
        deadline, delay = time.monotonic() + retry_for_s, 0.2
        while True:
            try:
                r = self._http.request(method, path, **kw)
                if r.status_code < 500:
                    r.raise_for_status()
                    return r.json() if r.content else None
                err: Exception = httpx.HTTPStatusError(f"{r.status_code} {r.text[:200]}",
                                                       request=r.request, response=r)
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

    def logs(self, run_id: str, lines: list[dict], retry_for_s: float) -> None:
        self.call("POST", f"/api/internal/runs/{run_id}/logs", retry_for_s=retry_for_s,
                  json={"lines": lines})

    def upload(self, run_id: str, rel: str, path: Path) -> None:
        self.call("PUT", f"/api/internal/runs/{run_id}/files/{rel}", retry_for_s=1800,
                  content=path.read_bytes(), timeout=120)

    def append(self, run_id: str, rel: str, offset: int, data: bytes) -> None:
        """Bytes a job appended to one of its live files, written at `offset` (idempotent)."""
        self.call("PUT", f"/api/internal/runs/{run_id}/files/{rel}", retry_for_s=0,
                  params={"offset": offset}, content=data, timeout=30)

    def finish(self, run_id: str, **body) -> dict:
        return self.call("POST", f"/api/internal/runs/{run_id}/finish", retry_for_s=1800,
                         json=body)

    def worker_heartbeat(self, **body) -> None:
        try:
            self.call("POST", "/api/internal/workers/heartbeat", retry_for_s=0, json=body,
                      timeout=3, quiet=not self._reached)
            self._reached = True
        except BackendUnavailable as exc:
            # `paralab up` starts the worker beside the backend: until the backend has answered
            # once, "not there yet" is the expected state, not a failure worth a warning.
            (log.warning if self._reached else log.debug)("worker heartbeat failed: %s", exc)
