"""Several hosts on one machine, for the multi-host tests and benchmarks: one backend, and
one worker process per "host", each with its own worker name, host label and data directory,
on loopback (gloo). That is placement, rendezvous and per-node supervision as on real hosts;
only the network is one machine's (docs/hosts.md)."""

from __future__ import annotations

import subprocess

from devtools.service import Service, wait_for


class Cluster(Service):
    """A Service whose workers pose as separate hosts."""

    def __init__(self, tmp, *, db_url, redis_url, extra_env=None):
        super().__init__(tmp, db_url=db_url, redis_url=redis_url, extra_env={
            "PARALAB_WORKER_ADDRESS": "127.0.0.1", "PARALAB_QUEUE_CLAIM_TIMEOUT_S": "6",
            **(extra_env or {})})
        self.workers: dict[str, subprocess.Popen] = {}

    def worker_name(self, host: str) -> str:
        return f"{self.queue}@{host}"

    def start_host(self, host: str, *, ranks: int = 2, slots: int = 2) -> None:
        env = {**self.env, "PARALAB_WORKER_HOST": host, "PARALAB_WORKER_NAME":
               self.worker_name(host), "PARALAB_WORKER_RANKS": str(ranks),
               "PARALAB_WORKER_SLOTS": str(slots),
               "PARALAB_DATA_DIR": str(self.tmp / f"host-{host}")}
        log = open(self.tmp / f"worker-{host}.log", "ab")
        self.workers[host] = subprocess.Popen(
            self._argv("worker"), env=env, cwd=self.tmp, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True)
        wait_for(lambda: any(w["name"] == self.worker_name(host) for w in self.http.get(
            "/api/workers").json()), 60, f"worker of host {host} to report in")

    def close(self) -> None:
        for p in self.workers.values():
            self.stop(p)
        super().close()
