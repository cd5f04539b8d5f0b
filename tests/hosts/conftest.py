"""Several hosts on one machine: one backend, and one worker process per "host", each with its
own worker name, host label and data directory, on loopback (gloo), against real Redis and
PostgreSQL (the team deployment). That is placement, rendezvous and per-node supervision as on
real hosts; only the network is one machine's (docs/hosts.md)."""

from __future__ import annotations

import re

import pytest

from devtools.cluster import Cluster
from tests.conftest import REDIS_URL, _fresh_pg_database


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
