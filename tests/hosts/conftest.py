"""Several hosts on one machine: one backend, and one worker process per "host", each with its
own worker name, host label and data directory, on loopback (gloo), against real Redis and
PostgreSQL (the team deployment). That is placement, rendezvous and per-node supervision as on
real hosts; only the network is one machine's (docs/hosts.md)."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.conftest import REDIS_URL, Service, _fresh_pg_database, wait_for


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


def both_nodes_training(c, run_id: str) -> bool:
    """Both nodes running and a rank on each host has logged a step. Which global ranks a
    host gets is torch's choice (c10d numbers the nodes in the sorted order of their
    descriptors: address, then the agent's pid), so any rank counts."""
    run = c.run(run_id)
    if run["status"] != "running" or [n["status"] for n in run["nodes"]] != ["running"] * 2:
        return False
    text = c.http.get(f"/api/runs/{run_id}/logs").text
    return all(re.search(rf"^\[{h} node{i}\] \[default\d+\]:step ", text, re.M)
               for i, h in ((0, "hostA"), (1, "hostB")))


def cluster_fixture(tmp, pg_server_url, hosts=("hostA", "hostB"), *, ranks: int = 2,
                    slots: int = 2, **kw):
    url, drop = _fresh_pg_database(pg_server_url)
    c = Cluster(tmp, db_url=url, redis_url=REDIS_URL, **kw)
    try:
        c.start_backend()
        for h in hosts:
            c.start_host(h, ranks=ranks, slots=slots)
        yield c
    finally:
        c.close()
        drop()


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory, pg_server_url):
    yield from cluster_fixture(tmp_path_factory.mktemp("hosts"), pg_server_url)
