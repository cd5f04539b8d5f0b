"""A multi-host run in Chromium against the real service with two "hosts" (two worker
processes, tests/hosts): the run page's Hosts section lists both nodes while they run and,
after the run, which rank ran on which host (the `placement` table of the ranks' own trace
meta); the cluster page shows both hosts held by the run. Every wait is on a condition."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.conftest import FINISHED, wait_for
from tests.frontend.browser import shot
from tests.hosts.conftest import both_nodes_training, cluster_fixture

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def svc(tmp_path_factory, pg_server_url):  # replaces the frontend's one-host service
    yield from cluster_fixture(tmp_path_factory.mktemp("hosts-pages"), pg_server_url)


def test_run_page_and_cluster_page_show_both_hosts(svc, page):
    run = svc.submit({"preset": "ddp", "name": "two hosts", "parallel": {"dp": 4},
                      "runtime": {"nnodes": 2, "nproc_per_node": 2},
                      "train": {"steps": 1_000_000}})
    svc.wait_status(run["id"], "running", 120)
    page.goto(f"{svc.url}/runs/{run['id']}")
    section = page.locator("#hosts-section")
    expect(section).to_be_visible()
    for node, host in ((0, "hostA"), (1, "hostB")):
        row = page.locator(f"#hosts-nodes tr[data-node='{node}']")
        expect(row).to_have_attribute("data-host", host)
    page.reload()  # the nodes' statuses as they are now: both claimed
    expect(page.locator("#hosts-nodes tr[data-status='running']")).to_have_count(2,
                                                                                  timeout=60_000)
    expect(page.locator("#run-meta")).to_contain_text("on 2 hosts")

    page.goto(f"{svc.url}/cluster")
    for host in ("hostA", "hostB"):
        held = page.locator(f"#hosts tbody tr[data-host='{host}'] .held-by "
                            f"li[data-run-id='{run['id']}']")
        expect(held).to_contain_text("2 ranks · running", timeout=60_000)
    expect(page.locator("#hosts tbody tr")).to_have_count(2)
    shot(page, "cluster-two-hosts")

    wait_for(lambda: both_nodes_training(svc, run["id"]), 300, "both nodes training")
    assert svc.http.post(f"/api/runs/{run['id']}/cancel").status_code == 200
    done = svc.wait_status(run["id"], FINISHED, 120)
    assert done["status"] == "cancelled", done["error"]
    page.goto(f"{svc.url}/runs/{run['id']}")
    expect(page.locator("#hosts-nodes tr[data-status='cancelled']")).to_have_count(2)
    ranks = page.locator("#hosts-ranks tbody tr")
    expect(ranks).to_have_count(4, timeout=60_000)
    # each host ran two consecutive ranks (which two is torch's node order, not ours)
    on = {}
    for rank in range(4):
        host = page.locator(f"#hosts-ranks tr[data-rank='{rank}']").get_attribute("data-host")
        on.setdefault(host, []).append(rank)
    assert sorted(on) == ["hostA", "hostB"] and sorted(on.values()) == [[0, 1], [2, 3]], on
    shot(page, "run-two-hosts")
