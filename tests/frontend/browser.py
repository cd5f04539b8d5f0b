"""Chromium for the dashboard tests and benchmarks: Debian's binary, never a download."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.browser import CHROMIUM, launch_chromium
from tests.conftest import ROOT

SHOTS = ROOT / "test-artifacts" / "screenshots"


def chromium_browser() -> Iterator:
    """Body of a module-scoped `browser` fixture: Debian's Chromium through Playwright. A
    missing browser fails (as a missing PostgreSQL does): a skipped front end is untested."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no Chromium at {CHROMIUM}: run scripts/provision.sh "
                    "(apt-get install chromium)")
    from playwright.sync_api import sync_playwright
    with sync_playwright() as pw:
        b = launch_chromium(pw)
        yield b
        b.close()


def shot(pg, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    pg.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)
    # A full-page capture leaves headless Chromium's hit-testing offset until the viewport is
    # set again: later clicks would land on the wrong element.
    size = pg.viewport_size
    pg.set_viewport_size({"width": size["width"], "height": size["height"] + 1})
    pg.set_viewport_size(size)
