"""The sweep builder on /sweeps in Chromium (issue 37 item 11), against the backend alone (no
worker: the members stay queued, no run costs anything): a base and grid axes picked from the
spec's field list, the member count and the server's verdict on each member before launch,
then launch, the sweep's page, and the stored sweep as the API returns it."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.conftest import backend_only_service
from tests.frontend.browser import shot

EVIL = "<img src=x onerror=alert(3)>"


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    yield from backend_only_service(tmp_path_factory.mktemp("sweep-builder"))


def axis(page, i: int, field: str, values: str) -> None:
    row = page.locator("#sb-axes .sb-axis").nth(i)
    row.locator(".sb-field").select_option(field)
    row.locator(".sb-values").fill(values)


def test_build_check_and_launch_a_sweep_from_the_browser(svc, page):
    page.goto(f"{svc.url}/sweeps")
    expect(page.locator("#sb-form")).to_have_attribute("data-ready", "1")
    # the axis fields are the spec's own list (GET /api/spec), not a second one
    fields = svc.http.get("/api/spec").json()["fields"]
    offered = page.locator("#sb-axes .sb-axis .sb-field option").evaluate_all(
        "os => os.map(o => o.value).filter(Boolean)")
    assert set(offered) <= set(fields) and "parallel.zero_stage" in offered
    assert "train.lr" in offered and "model.hidden" in offered
    page.fill("#sb-name", EVIL)
    page.select_option("#sb-preset", "ddp")
    axis(page, 0, "parallel.zero_stage", "0, 2, 3")
    page.click("#sb-add-axis")
    # a value the field's type refuses is named beside its axis, nothing is sent
    axis(page, 1, "parallel.dp", "2, lots")
    expect(page.locator("#sb-axes .sb-axis").nth(1).locator(".sb-msg")).to_contain_text(
        "lots: not a whole number")
    expect(page.locator("#sb-launch")).to_be_disabled()
    # dp 3 with 2 ranks per host: the server's own check refuses those members, before launch
    axis(page, 1, "parallel.dp", "2, 3")
    expect(page.locator("#sb-count")).to_have_attribute("data-members", "6")
    expect(page.locator("#sb-count")).to_contain_text("6 members")
    expect(page.locator("#sb-count")).to_have_attribute("data-valid", "3")
    expect(page.locator("#sb-status")).to_contain_text("3 of 6 members valid")
    expect(page.locator("#sb-errors li")).to_have_count(3)
    expect(page.locator("#sb-errors li").first).to_contain_text("parallel.dp=3")
    assert svc.http.get("/api/sweeps").json()["items"] == []  # checking stored nothing
    assert svc.http.get("/api/runs").json()["items"] == []
    expect(page.locator("#sb-launch")).to_be_enabled()
    shot(page, "sweep-builder")
    page.click("#sb-launch")
    page.wait_for_url("**/sweeps/*")
    sweep_id = page.url.rsplit("/", 1)[1]
    expect(page.locator("#sweep-members tbody tr")).to_have_count(6)
    expect(page.locator("#sweep-name")).to_have_text(EVIL)
    assert page.locator("main img").count() == 0
    stored = svc.http.get(f"/api/sweeps/{sweep_id}").json()
    assert stored["name"] == EVIL and stored["base"] == {"preset": "ddp"}
    assert stored["grid"] == {"parallel.zero_stage": [0, 2, 3], "parallel.dp": [2, 3]}
    assert stored["counts"]["total"] == 6 and stored["counts"].get("invalid") == 3
    assert [m["errors"] is None for m in stored["members"]] == [True, False] * 3


def test_a_run_as_the_base_and_a_grid_the_server_refuses(svc, page):
    r = svc.http.post("/api/runs", json={"preset": "zero2", "name": "base run",
                                         "runtime": {"queue": "nobody"}})
    assert r.status_code == 201, r.text
    run = r.json()
    page.goto(f"{svc.url}/sweeps?base_run={run['id']}")
    expect(page.locator("#sb-form")).to_have_attribute("data-ready", "1")
    expect(page.locator("#sb-base-msg")).to_contain_text("base run")
    axis(page, 0, "parallel.bucket_mb", "1, 5")
    expect(page.locator("#sb-status")).to_contain_text("all 2 members valid")
    # every member invalid: the server's 422, shown inline, and no launch
    axis(page, 0, "parallel.dp", "3, 5")
    expect(page.locator("#sb-status")).to_contain_text("refuses")
    expect(page.locator("#sb-errors li")).to_have_count(2)
    expect(page.locator("#sb-launch")).to_be_disabled()
    axis(page, 0, "parallel.bucket_mb", "1, 5")
    expect(page.locator("#sb-launch")).to_be_enabled()
    page.click("#sb-launch")
    page.wait_for_url("**/sweeps/*")
    stored = svc.http.get(f"/api/sweeps/{page.url.rsplit('/', 1)[1]}").json()
    assert stored["base"]["parallel"]["zero_stage"] == 2 and "name" not in stored["base"]
    assert stored["grid"] == {"parallel.bucket_mb": [1, 5]}
    assert stored["counts"]["total"] == 2
