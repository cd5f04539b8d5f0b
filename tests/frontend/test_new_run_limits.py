"""The new-run form shows the caller's quotas (GET /api/users/{name}/limits) and names a
timeout outside the admin's bounds inline before submit, in Chromium against `paralab serve`
(local mode with the bounds set: local mode applies only what is set)."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.conftest import Service
from tests.frontend.browser import shot


@pytest.fixture(scope="module")
def bounded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("limits")
    svc = Service(tmp, db_url=f"sqlite:///{tmp / 'p.db'}", redis_url=None, extra_env={
        "PARALAB_QUOTA_MAX_TIMEOUT_S": "3600", "PARALAB_QUOTA_MIN_HANG_TIMEOUT_S": "10"})
    try:
        svc.start_backend()
        yield svc
    finally:
        svc.close()


def test_the_form_shows_the_limits_and_names_a_timeout_out_of_bounds(bounded, page):
    page.goto(f"{bounded.url}/new?preset=ddp")
    limits = page.locator("#limits")
    expect(limits).to_contain_text("runtime.timeout_s ≤ 3600 s")
    expect(limits).to_contain_text("runtime.hang_timeout_s ≥ 10 s")
    expect(limits).to_contain_text("0 runs queued or running")
    timeout = page.locator("#f-runtime-timeout_s")
    assert timeout.get_attribute("max") == "3600"

    timeout.fill("7200")
    field = page.locator('.field[data-field="runtime.timeout_s"]')
    expect(field.locator(".msg")).to_contain_text("at most 3600 s on this server")
    expect(field.locator(".msg")).to_contain_text("PARALAB_QUOTA_MAX_TIMEOUT_S")
    expect(field).to_have_class("field changed invalid")
    expect(page.locator("#submit")).to_be_disabled()
    shot(page, "new-run-limits")

    timeout.fill("600")
    page.locator("#f-runtime-hang_timeout_s").fill("0")
    hang = page.locator('.field[data-field="runtime.hang_timeout_s"] .msg')
    expect(hang).to_contain_text("0 turns the hang watch off")
    expect(field.locator(".msg")).to_have_text("")
    expect(page.locator("#submit")).to_be_disabled()

    page.locator("#f-runtime-hang_timeout_s").fill("60")
    expect(hang).to_have_text("")
    expect(page.locator("#submit")).to_be_enabled()
