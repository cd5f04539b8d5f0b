"""Bounded tracing in the dashboard (real service, real Chromium): the new-run form shows the
predicted trace size of the `trace` section before submit (POST /api/predict's `trace`), and
the run page says which steps were traced."""

from __future__ import annotations

import re

from playwright.sync_api import expect

TRACE = {"wait": 1, "warmup": 1, "active": 2, "repeat": 2}


def test_form_shows_predicted_trace_size(svc, page):
    page.goto(f"{svc.url}/new?preset=ddp")
    page.fill("#f-train-steps", "12")
    page.fill("#f-trace-active", "2")
    for name in ("wait", "warmup", "repeat"):
        page.fill(f"#f-trace-{name}", str(TRACE[name]))
    box = page.locator("#pred-trace")
    expect(box).to_have_attribute("data-traced-steps", "2-3,6-7")
    want = svc.http.post("/api/predict", json={"preset": "ddp", "train": {"steps": 12},
                                                "trace": TRACE}).json()["trace"]
    expect(box).to_have_attribute("data-records", str(want["records"]))
    expect(box).to_contain_text("4 of 12 steps traced")
    expect(box).to_contain_text("schedule: wait 1, warmup 1, active 2, repeat 2")
    # an invalid schedule is named at its field and blocks submit
    page.fill("#f-trace-active", "0")
    expect(page.locator("#f-trace-wait")).to_have_attribute("aria-invalid", "true")
    expect(page.locator("#submit")).to_be_disabled()


def test_form_states_the_default_bound(svc, page):
    """No schedule set: the form states the default (the first 20 steps, then 5 in every 100,
    at most 500,000 detailed records per rank) and 2,000 steps trace 120 (counted by hand)."""
    page.goto(f"{svc.url}/new?preset=ddp")
    page.fill("#f-train-steps", "2000")
    box = page.locator("#pred-trace")
    expect(box).to_contain_text("120 of 2000 steps traced")
    expect(box).to_have_attribute("data-schedule", re.compile(
        r"^default: the first 20 steps, then 5 in every 100, at most 500,000 detailed"))
    expect(box).to_contain_text('trace.steps = "all" traces every step')


def test_run_page_says_which_steps_were_traced(svc, page):
    run = svc.submit({"preset": "ddp", "name": "bounded-page", "train": {"steps": 12},
                      "trace": TRACE})
    done = svc.wait_status(run["id"], ("succeeded", "failed"), 180)
    assert done["status"] == "succeeded", done["error"]
    page.goto(f"{svc.url}/runs/{run['id']}")
    box = page.locator("#trace-coverage")
    expect(box).to_have_attribute("data-traced-steps", "2-3,6-7")
    expect(box).to_contain_text("4 of 12")
    expect(box).to_contain_text("schedule: wait 1, warmup 1, active 2, repeat 2")
