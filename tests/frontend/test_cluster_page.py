"""The cluster page (/cluster) in Chromium against the real service (issue #16 part 5): the
service's worker shows as a host with its slots; a second worker process with its own
PARALAB_WORKER_HOST makes a second host; a running run appears under the host whose worker
claimed it; a run queued where no worker listens shows why it waits. Every wait is on a
condition with a generous timeout."""

from __future__ import annotations

import secrets
import subprocess

import pytest
from playwright.sync_api import expect

from tests.conftest import backend_only_service, wait_for
from tests.frontend.browser import shot

HOST_B = "host-b-" + secrets.token_hex(2)
EVIL = "<img src=x onerror=alert(1)>"


@pytest.fixture(scope="module")
def second_worker(svc):
    """A second `paralab worker` with its own name, host label and queue, as a second GPU
    host's worker would be."""
    queue = f"{svc.queue}-b"
    env = {**svc.env, "PARALAB_QUEUE": queue, "PARALAB_WORKER_NAME": "worker-b",
           "PARALAB_WORKER_HOST": HOST_B}
    log = open(svc.tmp / "worker-b.log", "ab")
    proc = subprocess.Popen([*svc._argv("worker")], env=env, cwd=svc.tmp, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: any(w["host"] == HOST_B for w in svc.http.get("/api/workers").json()),
                 90, "the second worker to report in")
        yield queue
    finally:
        svc.stop(proc)
        log.close()


def host_row(page, host: str):
    return page.locator(f"#hosts tbody tr[data-host='{host}']")


def test_hosts_slots_running_and_waiting_runs(svc, second_worker, page):
    first = next(w for w in svc.http.get("/api/workers").json() if w["queue"] == svc.queue)
    page.goto(f"{svc.url}/cluster")
    expect(page.locator("[data-nav='cluster']")).to_have_attribute("aria-current", "page")
    a = host_row(page, first["host"])
    expect(a).to_have_count(1)
    expect(a.locator(".slots-bar")).to_have_attribute(
        "aria-label", f"0 of {first['slots']} slots busy, {first['slots']} free")
    expect(a.locator(".slot.free")).to_have_count(first["slots"])
    expect(a.locator(".devices li")).not_to_have_count(0)
    # the second worker: its own host, shown after the page's next refresh
    b = host_row(page, HOST_B)
    expect(b).to_have_count(1, timeout=60_000)
    expect(b).to_contain_text("worker-b")
    expect(b).to_contain_text(second_worker)
    expect(page.locator("#hosts tbody tr")).to_have_count(2)
    expect(page.locator("#hosts-empty")).to_be_hidden()

    # a long run on the first host: listed under it while it runs
    run = svc.submit({"preset": "ddp", "name": EVIL, "train": {"steps": 1_000_000}})
    waiting = f"nobody-{secrets.token_hex(3)}"
    r = svc.http.post("/api/runs", json={"preset": "ddp", "name": "waits",
                                         "runtime": {"queue": waiting}})
    assert r.status_code == 201, r.text
    queued = r.json()
    try:
        svc.wait_status(run["id"], "running", timeout=120)
        link = a.locator(f".host-runs a[data-run-id='{run['id']}']")
        expect(link).to_have_text(EVIL, timeout=60_000)  # as text, never as markup
        expect(link).to_have_attribute("href", f"/runs/{run['id']}")
        expect(a.locator(".slot.busy")).to_have_count(1, timeout=60_000)
        expect(b.locator(".host-runs a")).to_have_count(0)
        # the run queued where no worker listens: why it waits
        row = page.locator(f"#queued tbody tr[data-run-id='{queued['id']}']")
        expect(row.locator(".reason")).to_have_text(
            f"no live worker serves queue '{waiting}': start one with PARALAB_QUEUE={waiting} "
            "(docs/deploy.md, adding a GPU host)")
        expect(page.locator("#queued-empty")).to_be_hidden()
        expect(page.locator(f"#queues tbody tr[data-queue='{waiting}']")).to_contain_text("0 / 0")
        assert page.locator("img").count() == 0
        shot(page, "cluster")
    finally:
        for rid in (run["id"], queued["id"]):
            svc.http.post(f"/api/runs/{rid}/cancel")
    svc.wait_status(run["id"], ("cancelled", "failed", "succeeded"), timeout=120)
    expect(a.locator(".host-runs a")).to_have_count(0, timeout=60_000)
    expect(page.locator("#queued-empty")).to_have_text("No run is waiting.")


@pytest.fixture(scope="module")
def lone_backend(tmp_path_factory):
    """The backend without any worker: the page's empty states."""
    yield from backend_only_service(tmp_path_factory.mktemp("cluster-empty"))


def test_empty_states_without_workers(lone_backend, page):
    page.goto(f"{lone_backend.url}/cluster")
    page.wait_for_selector("body[data-ready='1']")
    expect(page.locator("#hosts tbody tr")).to_have_count(0)
    expect(page.locator("#hosts-empty")).to_be_visible()
    expect(page.locator("#hosts-empty")).to_contain_text("No live worker")
    expect(page.locator("#queued-empty")).to_have_text("No run is waiting.")
    # a run submitted now waits for a worker, and the page says so on its next refresh
    r = lone_backend.http.post("/api/runs", json={"preset": "ddp", "name": "alone"})
    assert r.status_code == 201, r.text
    row = page.locator(f"#queued tbody tr[data-run-id='{r.json()['id']}']")
    expect(row.locator(".reason")).to_contain_text("no live worker serves queue 'default'",
                                                   timeout=30_000)
    expect(page.locator("#queued-empty")).to_be_hidden()
    expect(page.locator("#cluster-error")).to_have_text("")
