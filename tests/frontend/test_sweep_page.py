"""The sweep pages in Chromium against the backend alone (no worker: the members stay queued,
so this costs no runs; docs/sweeps.md): every member in the table, sorting, the
parallel-coordinates plot, the invalid member's reason, user strings shown as text."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.conftest import backend_only_service
from tests.frontend.browser import shot

EVIL = "<script>alert(1)</script><img src=x onerror=alert(2)>"


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    yield from backend_only_service(tmp_path_factory.mktemp("sweep-page"))


@pytest.fixture(scope="module")
def sweep(svc) -> dict:
    r = svc.http.post("/api/sweeps", json={
        "name": EVIL, "base": {"preset": "ddp", "model": {"arch": "mlp"}},
        "members": [{"parallel": {"zero_stage": z}} for z in (0, 2, 3)]
        + [{"parallel": {"dp": 3}}]})
    assert r.status_code == 201, r.text
    return r.json()


def order(page) -> list[int]:
    return [int(i) for i in page.locator("#sweep-members tbody tr").evaluate_all(
        "rows => rows.map(r => r.dataset.index)")]


def test_sweep_page_table_sort_plot_reason_and_escaping(svc, sweep, page):
    page.goto(f"{svc.url}/sweeps/{sweep['id']}")
    expect(page.locator("#sweep-members tbody tr")).to_have_count(4)
    expect(page.locator("#sweep-name")).to_have_text(EVIL)
    assert page.locator("main img").count() == 0 and page.locator("main script").count() == 0
    bad = page.locator("#sweep-members tr[data-status='invalid']")
    expect(bad).to_have_count(1)
    expect(bad.locator("td[data-col='reason']")).to_contain_text(
        sweep["members"][3]["errors"][0]["msg"])
    # sort by predicted peak memory per rank: ZeRO-3 below DDP = ZeRO-2 (its gradient saving
    # spent on the reduce-scatter buffer; ties by index); the invalid member last either way
    page.click("th[data-sort='pred_peak_memory_bytes']")
    assert order(page) == [2, 0, 1, 3]
    page.click("th[data-sort='pred_peak_memory_bytes']")
    assert order(page) == [0, 1, 2, 3]
    page.click("th[data-sort='overrides']")
    assert order(page) == [3, 0, 1, 2]  # parallel.dp=3 sorts before parallel.zero_stage=...
    plot = page.locator("#sweep-parcoords[data-ready='1']")
    expect(plot).to_have_count(1)
    dims = plot.evaluate("d => d.data[0].dimensions.map(x => x.label)")
    assert dims[0] == "parallel.zero_stage" and "peak mem / rank (pred.)" in dims
    assert plot.evaluate("d => d.data[0].type") == "parcoords"
    assert page.locator("#sweep-parcoords .parcoords").count() > 0  # drawn, not only data
    expect(page.locator("#sweep-cancel")).to_be_visible()
    shot(page, "sweep-page")
    page.click("#sweep-cancel")
    expect(page.locator("#sweep-status")).to_have_text("cancelled")
    expect(page.locator("#sweep-cancel")).to_be_hidden()


def test_sweeps_list_reachable_from_the_nav(svc, sweep, page):
    page.goto(f"{svc.url}/")
    page.click("nav a[data-nav='sweeps']")
    row = page.locator(f"#sweeps-table tr[data-id='{sweep['id']}']")
    expect(row.locator("a")).to_have_text(EVIL)
    assert page.locator("main img").count() == 0
    row.locator("a").click()
    expect(page.locator("#sweep-members tbody tr")).to_have_count(4)
    page.goto(f"{svc.url}/sweeps/nope")
    expect(page.locator("main")).to_contain_text("not found")
