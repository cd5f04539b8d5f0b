"""Fixtures of the dashboard's browser tests: one real service (`paralab serve` + `paralab
worker` on a fresh SQLite database, embedded broker) and one headless Chromium (Debian's
/usr/bin/chromium, driven by Playwright; never `playwright install`) shared by the module."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import Service
from tests.frontend.browser import CHROMIUM, launch_chromium


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dashboard")
    service = Service(tmp, db_url=f"sqlite:///{tmp}/p.db", redis_url=None)
    try:
        service.start_backend()
        service.start_worker()
        yield service
    finally:
        service.close()


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    from playwright.sync_api import sync_playwright
    with sync_playwright() as pw:
        b = launch_chromium(pw)
        yield b
        b.close()


@pytest.fixture
def page(browser):
    """A 1280x800 page that fails the test on any uncaught script error or any dialog
    (an injected `alert` would open one)."""
    ctx = browser.new_context(viewport={"width": 1280, "height": 800})
    pg = ctx.new_page()
    pg.set_default_timeout(60_000)
    problems: list[str] = []
    pg.on("pageerror", lambda e: problems.append(f"page error: {e}"))

    def on_dialog(d):
        problems.append(f"dialog: {d.message}")
        d.dismiss()
    pg.on("dialog", on_dialog)
    yield pg
    ctx.close()
    assert problems == []
