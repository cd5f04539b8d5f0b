"""Every page at a phone's width and a laptop's (issue 37 item 9), in Chromium: no horizontal
scroll at 390 px (document.scrollingElement.scrollWidth <= the viewport's width) with the nav
folded into a menu that opens, and none at 1280 px with the whole nav shown. The pages are
the backend's own page routes (backend/api/routes/pages.py), so a new page cannot be left out:
a route with a path parameter needs an example below, or this test fails. A screenshot of
every page at both widths goes to test-artifacts/screenshots/layout-*.png.

Backend alone (no worker): the run is reported finished through the worker channel with a
headline, the sweep's members stay queued."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from backend.api.routes.pages import render_page
from backend.api.routes.pages import router as pages_router
from tests.conftest import backend_only_service
from tests.frontend.browser import shot

WIDTHS = (390, 1280)
NAV_LINKS = 10  # base.html: nine pages and the API docs


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    yield from backend_only_service(tmp_path_factory.mktemp("layout"))


def page_paths() -> list[str]:
    """Every HTML page the backend serves (GET routes of the pages router but plotly.js)."""
    return sorted(r.path for r in pages_router.routes
                  if "GET" in getattr(r, "methods", ()) and not r.path.startswith("/static/"))


@pytest.fixture(scope="module")
def examples(svc) -> dict[str, str]:
    """A URL for each page route: path parameters filled with a run and a sweep that exist."""
    auth = {"Authorization": f"Bearer {svc.env['PARALAB_WORKER_TOKEN']}"}
    ids = []
    for preset, name in (("ddp", "a run with a long name to wrap at 390 px wide"),
                         ("zero2", "zero2 run")):
        r = svc.http.post("/api/runs", json={"preset": preset, "name": name,
                                             "runtime": {"queue": svc.queue}})
        assert r.status_code == 201, r.text
        ids.append(r.json()["id"])
    svc.http.post(f"/api/internal/runs/{ids[0]}/claim", headers=auth,
                  json={"worker": "layout", "task_id": None}).raise_for_status()
    svc.http.post(f"/api/internal/runs/{ids[0]}/finish", headers=auth, json={
        "status": "succeeded", "exit_code": 0, "summary": {"headline": {
            "step_time_s": 0.05, "tokens_per_s": 2e4, "peak_memory_bytes": 272_000}}},
    ).raise_for_status()
    sw = svc.http.post("/api/sweeps", json={
        "name": "layout sweep", "base": {"preset": "ddp", "runtime": {"queue": "nobody"}},
        "grid": {"parallel.zero_stage": [0, 2, 3], "parallel.bucket_mb": [1, 25]}})
    assert sw.status_code == 201, sw.text
    fill = {"run_id": ids[0], "sweep_id": sw.json()["id"]}
    out = {}
    for path in page_paths():
        params = re.findall(r"{(\w+)}", path)
        missing = [p for p in params if p not in fill]
        assert not missing, f"page route {path}: add an example for {missing} to this test"
        url = re.sub(r"{(\w+)}", lambda m: fill[m.group(1)], path)
        out[path] = url + (f"?ids={ids[0]},{ids[1]}" if path == "/compare" else "")
    return out


def test_the_page_list_is_the_backends(examples):
    assert {"/", "/new", "/compare", "/sweeps", "/advise", "/cluster", "/schedules",
            "/collectives", "/login", "/runs/{run_id}", "/sweeps/{sweep_id}"} <= set(examples)


def settle(page) -> None:
    """The page's scripts have drawn what they draw from their first answers."""
    try:
        page.wait_for_load_state("networkidle", timeout=15_000)
    except Exception:  # noqa: BLE001 - a page with a live stream never idles: go on
        pass
    page.evaluate("() => document.fonts.ready")


def overflow(page) -> dict:
    return page.evaluate("""() => {
        const w = document.documentElement.clientWidth;
        const wide = [...document.querySelectorAll('body *')].filter(e => {
            const r = e.getBoundingClientRect();
            return r.width > 0 && r.right > w + 1 && !e.closest('.table-wrap, table.data, '
                + '.js-plotly-plot');
        }).slice(0, 5).map(e => `${e.tagName}#${e.id}.${e.className} ${
            Math.round(e.getBoundingClientRect().right)}`);
        return {scroll: document.scrollingElement.scrollWidth, viewport: window.innerWidth,
                wide};
    }""")


@pytest.mark.parametrize("width", WIDTHS)
def test_no_page_scrolls_sideways(svc, examples, browser, width):
    ctx = browser.new_context(viewport={"width": width, "height": 844 if width < 500 else 800})
    page = ctx.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    # the login page is served only in team mode (PARALAB_AUTH=required; here it redirects):
    # its own template, rendered as the backend renders it, on this origin
    page.route(f"{svc.url}/login", lambda route: route.fulfill(
        status=200, content_type="text/html", body=render_page("login.html")))
    bad = {}
    try:
        for path, url in examples.items():
            page.goto(svc.url + url)
            settle(page)
            o = overflow(page)
            name = "login" if path == "/login" else (
                path.strip("/").replace("/", "-").replace("{", "").replace("}", "") or "runs")
            shot(page, f"layout-{name}-{width}")
            if o["scroll"] > o["viewport"]:
                bad[path] = o
        assert bad == {}, f"pages wider than {width} px: {bad}"
        assert errors == []
    finally:
        ctx.close()


def test_the_nav_is_a_menu_at_390_and_a_bar_at_1280(svc, browser):
    ctx = browser.new_context(viewport={"width": 390, "height": 844})
    page = ctx.new_page()
    try:
        page.goto(f"{svc.url}/sweeps")
        links = page.locator("header nav a")
        expect(links).to_have_count(NAV_LINKS)
        menu = page.locator("header .nav-toggle")
        expect(menu).to_be_visible()
        expect(links.first).to_be_hidden()
        menu.click()
        for i in range(NAV_LINKS):  # every link reachable, inside the viewport
            expect(links.nth(i)).to_be_visible()
            box = links.nth(i).bounding_box()
            assert box["x"] >= 0 and box["x"] + box["width"] <= 390, box
        assert page.evaluate("() => document.scrollingElement.scrollWidth") <= 390
        shot(page, "layout-menu-open-390")
        page.locator("header nav a[data-nav='cluster']").click()
        page.wait_for_url("**/cluster")
        page.set_viewport_size({"width": 1280, "height": 800})
        expect(page.locator("header .nav-toggle")).to_be_hidden()
        for i in range(NAV_LINKS):
            expect(links.nth(i)).to_be_visible()
        expect(page.locator("header nav a[aria-current='page']")).to_have_text("Cluster")
    finally:
        ctx.close()


def test_a_run_without_a_trace_says_so_in_short_boxes(svc, examples, browser):
    """A finished run that left no trace: each chart box says so in a short box instead of
    360 px of blank (at 390 px that was screens of nothing between the headings)."""
    ctx = browser.new_context(viewport={"width": 390, "height": 844})
    page = ctx.new_page()
    try:
        page.goto(svc.url + examples["/runs/{run_id}"])
        expect(page.locator("body[data-charts-ready='1']")).to_have_count(1)
        for sel in ("#memory-chart", "#comm-axis", "#comm-overlap", "#loss-chart",
                    "#throughput-chart"):
            box = page.locator(sel)
            expect(box).to_have_text("no trace for this run")
            assert box.bounding_box()["height"] < 120, sel
    finally:
        ctx.close()
