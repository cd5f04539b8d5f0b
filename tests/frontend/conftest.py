"""Fixtures of the dashboard's browser tests: one real service (`paralab serve` + `paralab
worker` on a fresh SQLite database, embedded broker) and one headless Chromium (Debian's
/usr/bin/chromium, driven by Playwright; never `playwright install`) shared by the module."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.conftest import embedded_service
from tests.frontend.browser import chromium_browser

# A page loads Plotly (megabytes of script) before its module runs: on a busy two-core machine
# that alone can pass Playwright's 5 s default, so the assertions wait up to 30 s (they return
# as soon as the condition holds; a failing one still fails)
expect.set_options(timeout=30_000)


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    yield from embedded_service(tmp_path_factory.mktemp("dashboard"))


@pytest.fixture(scope="module")
def browser():
    yield from chromium_browser()


@pytest.fixture
def page(browser):
    """A 1280x800 page that fails the test on any uncaught script error or any dialog
    (an injected `alert` would open one), except those a test expects: it appends the start
    of the message to `page.allowed_dialogs`, and that dialog is accepted."""
    ctx = browser.new_context(viewport={"width": 1280, "height": 800})
    pg = ctx.new_page()
    pg.set_default_timeout(60_000)
    problems: list[str] = []
    pg.on("pageerror", lambda e: problems.append(f"page error: {e}"))

    pg.allowed_dialogs = []

    def on_dialog(d):
        if any(d.message.startswith(m) for m in pg.allowed_dialogs):
            d.accept()
            return
        problems.append(f"dialog: {d.message}")
        d.dismiss()
    pg.on("dialog", on_dialog)
    yield pg
    ctx.close()
    assert problems == []
