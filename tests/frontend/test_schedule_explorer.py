"""The schedule explorer page (/schedules) in Chromium against a real backend: the Gantt has one
row per pipeline rank, cards follow the form live, and a 422 is shown next to its field.

The page needs no worker, so this module starts the backend alone (faster than `svc`)."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.conftest import backend_only_service
from tests.frontend.browser import shot


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    yield from backend_only_service(tmp_path_factory.mktemp("schedules"))


def gantt_rows(page) -> int:
    return page.evaluate("""() => {
        const ys = document.getElementById('sched-gantt').data.flatMap((t) => t.y);
        return new Set(ys.filter((y) => y !== null)).size;
    }""")


def test_schedule_explorer_live(backend, page):
    page.goto(f"{backend.url}/schedules")
    gantt = page.locator("#sched-gantt")
    expect(gantt).to_have_attribute("data-ready", "1")
    expect(gantt).to_have_attribute("data-rows", "4")  # default 1f1b p=4 m=8
    assert gantt_rows(page) == 4
    kinds = page.evaluate("() => document.getElementById('sched-gantt').data.map((t) => t.name)")
    assert any(k.startswith("F") for k in kinds) and any(k.startswith("BW") for k in kinds)
    expect(page.locator("[data-card='bubble fraction'] .value")).to_have_text("27.3 %")
    expect(page.locator("[data-card='bubble fraction'] .sub")).to_contain_text("27.3 %")
    expect(page.locator("#s-schedule option")).to_have_count(6)
    expect(page.locator("#sched-convention")).to_contain_text("bubble_fraction = idle / makespan")
    expect(page.locator("#sched-actions tbody tr")).to_have_count(4)
    shot(page, "schedules")

    # p = 2: 1F1B's bubble is (p-1)/(m+p-1) = 1/9; the Gantt has 2 rows; no reload.
    page.evaluate("() => { window.__same_page = true; }")
    page.fill("#s-p", "2")
    expect(gantt).to_have_attribute("data-rows", "2")
    expect(page.locator("[data-card='bubble fraction'] .value")).to_have_text("11.1 %")
    expect(page.locator("[data-card='bubble fraction'] .sub")).to_contain_text(
        "(p-1)/(v*m+p-1) = 11.1 %")
    assert "p=2" in page.url

    # zbv with v = 1: the simulator's rule, inline next to v ...
    page.select_option("#s-schedule", "zbv")
    v_msg = page.locator(".field[data-field='v'] .msg")
    expect(v_msg).to_contain_text("v = 2")
    expect(page.locator(".field[data-field='v'][class*='invalid']")).to_have_count(1)
    expect(v_msg).to_have_attribute("role", "alert")
    expect(page.locator("#sched-results")).to_have_class("stale")
    # ... and v = 2 clears it: a zero-bubble schedule, no closed form.
    page.fill("#s-v", "2")
    expect(v_msg).to_have_text("")
    expect(page.locator("#sched-results")).not_to_have_class("stale")
    expect(page.locator("[data-card='bubble fraction'] .sub")).to_have_text(
        "no closed form (zbv)")
    expect(page.locator("#sched-actions tbody tr").first).to_contain_text("0, 3")
    assert page.evaluate("() => window.__same_page") is True
