"""The new-run form keeps what the user typed (issue 37, item 1): the form's preset arrives
1-6 s after the page on a busy host, and a name typed meanwhile used to be replaced by the
preset's ("ddp"), so the history filled with identical rows. Here the preset load is held
back with page.route until the user has typed (no clock involved), then released; the stored
run must carry the typed name and tags. Backend only: the run stays queued, which is all the
name check needs."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.conftest import backend_only_service


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    yield from backend_only_service(tmp_path_factory.mktemp("newform"))


def hold(page, pattern: str) -> list:
    """Route `pattern` into a list of pending routes: the requests wait until the test
    continues them."""
    held: list = []
    page.route(pattern, lambda route: held.append(route))
    return held


def wait_held(page, held: list) -> None:
    # the handler runs when Playwright dispatches events; a short wait lets it, until the
    # page's request has arrived (no assertion on how long that takes)
    while not held:
        page.wait_for_timeout(20)


def test_a_name_typed_before_the_preset_loads_is_kept(backend, page):
    held = hold(page, "**/api/presets")
    page.goto(f"{backend.url}/new?preset=ddp")
    wait_held(page, held)
    # the form is visibly loading and cannot be sent half-built
    expect(page.locator("#form-loading")).to_be_visible()
    expect(page.locator("#submit")).to_be_disabled()
    page.fill("#name", "my <b>first</b> run")
    page.fill("#tags", "mine, typed-early")
    page.fill("#device-gb", "16")
    page.press("#name", "Enter")  # a submit before the load must not reload the page
    assert "name=" not in page.url
    held[0].continue_()
    page.unroute("**/api/presets")

    expect(page.locator("#f-train-steps")).to_be_visible()
    expect(page.locator("#form-loading")).to_be_hidden()
    expect(page.locator("#preset-title")).not_to_be_empty()
    expect(page.locator("#name")).to_have_value("my <b>first</b> run")
    expect(page.locator("#tags")).to_have_value("mine, typed-early")
    expect(page.locator("#device-gb")).to_have_value("16")
    page.click("#submit")
    page.wait_for_function("() => location.pathname.startsWith('/runs/')")
    run = backend.http.get(f"/api/runs/{page.url.rsplit('/', 1)[1]}").json()
    assert run["name"] == "my <b>first</b> run"
    assert run["tags"] == ["mine", "typed-early"]
    assert run["strategy"] == "ddp"


def test_a_typed_name_survives_a_preset_change_an_untyped_one_follows(backend, page):
    """...and the /new per-link table labels its nominal bandwidth as assumed."""
    page.goto(f"{backend.url}/new?preset=ddp")
    expect(page.locator("#f-train-steps")).to_be_visible()
    # not typed: the name is the preset's and follows the preset picked
    expect(page.locator("#name")).to_have_value("ddp")
    page.select_option("#preset", "zero2")
    expect(page.locator("#name")).to_have_value("zero2")
    # typed: a later preset changes the spec, never the name
    page.fill("#name", "kept")
    page.select_option("#preset", "fsdp")
    expect(page.locator("#f-parallel-zero_stage")).to_be_visible()
    expect(page.locator("#preset-title")).to_contain_text("FSDP")
    expect(page.locator("#name")).to_have_value("kept")
    # the per-link table's bus bandwidth is a nominal GPU link's unless set: it says so
    busbw = page.locator("#pred-links tbody tr[data-axis='dp'] td").nth(4)
    expect(busbw).to_contain_text("(assumed)")
    expect(page.locator("#pred-links-caption")).to_contain_text("not this host's")
    page.fill("#whatif-intra", "0.05")
    expect(busbw).to_have_text("50.0 MB/s")


def test_a_name_typed_before_a_clone_loads_is_kept(backend, page):
    r = backend.http.post("/api/runs", json={"preset": "ddp", "name": "source",
                                             "tags": ["from-source"]})
    assert r.status_code == 201, r.text
    held = hold(page, "**/api/runs/*")
    page.goto(f"{backend.url}/new?clone={r.json()['id']}")
    wait_held(page, held)
    page.fill("#name", "clone typed early")
    for route in held:
        route.continue_()
    page.unroute("**/api/runs/*")
    expect(page.locator("#form-title")).to_contain_text("Clone of source")
    expect(page.locator("#tags")).to_have_value("from-source")  # untouched: the clone's
    expect(page.locator("#name")).to_have_value("clone typed early")


def test_a_name_typed_before_the_form_s_script_runs_is_kept(backend, page):
    """The form's module itself can arrive after the inputs (a busy host): what was typed
    before any of its code ran is kept too."""
    held = hold(page, "**/static/js/new.js")
    page.goto(f"{backend.url}/new?preset=zero2", wait_until="commit")
    wait_held(page, held)
    page.fill("#name", "before the script")
    held[0].continue_()
    page.unroute("**/static/js/new.js")
    expect(page.locator("#f-train-steps")).to_be_visible()
    expect(page.locator("#preset-title")).to_contain_text("ZeRO-2")
    expect(page.locator("#name")).to_have_value("before the script")
