"""The advisor tells the truth (issue 37, item 6), in Chromium against a real backend: a preset
fills the model's fields and the answer names the model it ranked; times and sizes scale
(µs, MB: never "0.0000 s" / "0.00 GB"); a progress indicator while the search runs; a ranking
at typed figures says it is against ASSUMED hardware and names them, offers the queue's
measured figures where it has some, and "launch top k" warns before launching at assumed
figures; a sweep of k < 3 is told it gets no rank correlation, before and after. Requests
are held with page.route, never timed."""

from __future__ import annotations

import json

import pytest
from playwright.sync_api import expect

from tests.conftest import backend_only_service
from tests.frontend.browser import shot


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    yield from backend_only_service(tmp_path_factory.mktemp("advise-truth"))


def ready(page, url):
    page.goto(f"{url}/advise")
    expect(page.locator("body")).to_have_attribute("data-ready", "1")


def small_cluster(page, **extra):
    """1 host x 2 devices of 16 GB; the bandwidth and FLOP/s fields keep the form's typed
    defaults (300 GB/s, 25 GB/s, 300 TFLOP/s) unless `extra` says otherwise."""
    for k, v in {"hosts": "1", "devices_per_host": "2", "memory": "16", "top": "5",
                 **extra}.items():
        page.fill(f"#a-{k}", v)


def test_a_preset_fills_the_model_and_the_answer_names_it(backend, page):
    ready(page, backend.url)
    page.select_option("#a-preset", "moe")
    expect(page.locator("#a-arch")).to_have_value("gpt")
    expect(page.locator("#a-hidden")).to_have_value("64")
    expect(page.locator("#a-layers")).to_have_value("4")
    expect(page.locator("#a-seq_len")).to_have_value("16")
    expect(page.locator("#a-global_batch")).to_have_value("8")
    expect(page.locator("#a-preset-extra")).to_contain_text("4 experts, top-2")
    small_cluster(page)
    page.click("#advise-go")
    model = page.locator("#advise-model")
    expect(model).to_contain_text("Ranked for: gpt, 4 layers, hidden 64, 4 heads")
    expect(model).to_contain_text("4 experts, top-2 · global batch 8")
    # a field edited after the preset is what the answer is for (the preset keeps its experts)
    page.fill("#a-hidden", "128")
    page.click("#advise-go")
    expect(model).to_contain_text("hidden 128")
    expect(model).to_contain_text("4 experts, top-2")


def test_units_scale_progress_shows_and_rules_are_named_for_users(backend, page):
    ready(page, backend.url)
    page.select_option("#a-preset", "ddp")
    small_cluster(page)
    held = []
    page.route("**/api/advise", lambda route: held.append(route))
    page.click("#advise-go")
    expect(page.locator("#advise-progress")).to_be_visible()
    expect(page.locator("#advise-go")).to_be_disabled()
    while not held:  # let Playwright hand the request to the handler (not a timing check)
        page.wait_for_timeout(20)
    held[0].continue_()
    page.unroute("**/api/advise")
    rows = page.locator("#advise-table tbody tr")
    expect(rows.first).to_be_visible()
    expect(page.locator("#advise-progress")).to_be_hidden()
    expect(page.locator("#advise-go")).to_be_enabled()
    # a 4-layer MLP at 300 TFLOP/s: microseconds and megabytes, each cell scaled on its own
    cells = rows.first.locator("td")
    step, memory = cells.nth(2).text_content(), cells.nth(6).text_content()
    assert step.endswith(("ns", "µs", "ms")) and not step.startswith("0.0"), step
    assert memory.endswith(("kB", "MB")) and not memory.startswith("0.0"), memory
    table = page.locator("#advise-table").text_content()
    assert "0.0000" not in table and "0.00 GB" not in table
    title = page.evaluate("() => document.getElementById('advise-bars').layout.xaxis.title.text")
    assert title in ("step time (µs)", "step time (ns)", "step time (ms)"), title
    expect(page.locator("#advise-table thead")).to_contain_text("rules of thumb")
    body = page.locator("main").text_content() if page.locator("main").count() else \
        page.locator("body").text_content()
    assert "seed 004's rules" not in body and "seed 004 rules" not in body
    shot(page, "advise-units")


def test_assumed_hardware_is_said_and_a_launch_warns_first(backend, page):
    ready(page, backend.url)
    page.select_option("#a-arch", "mlp")
    for k, v in {"layers": "4", "hidden": "64", "global_batch": "8"}.items():
        page.fill(f"#a-{k}", v)
    small_cluster(page, queue="cpuq")
    page.click("#advise-go")
    expect(page.locator("#advise-table tbody tr").first).to_be_visible()
    banner = page.locator("#advise-assumed")
    expect(banner).to_be_visible()
    expect(banner).to_contain_text("Ranked against ASSUMED hardware")
    expect(banner).to_contain_text("300 TFLOP/s per device, 300 GB/s intra-host, "
                                   "25.0 GB/s inter-host")
    expect(banner).to_contain_text("Queue “cpuq” has no measured figures")

    # k = 2: said before the launch, and after it on the sweep's page
    page.fill("#launch-k", "2")
    expect(page.locator("#launch-note")).to_contain_text("needs ≥ 3 members; a sweep of 2")
    page.fill("#launch-name", "assumed")
    page.click("#launch-go")
    warning = page.locator("#launch-warning")
    expect(warning).to_contain_text("ASSUMED 300 TFLOP/s per device")
    expect(page.locator("#launch-go")).to_have_text("Launch anyway")
    assert backend.http.get("/api/sweeps").json()["items"] == []  # nothing launched yet
    shot(page, "advise-assumed")
    page.click("#launch-go")
    link = page.locator("#launch-status a")
    expect(link).to_have_count(1)
    expect(page.locator("#launch-status")).to_contain_text("fewer than 3")
    sweep = backend.http.get(f"/api/sweeps/{link.text_content()}").json()
    assert len(sweep["members"]) == 2
    # the members run on the queue the advisor was asked about
    assert {m["run"]["queue"] for m in sweep["members"]} == {"cpuq"}, sweep["members"]
    link.click()
    expect(page.locator("#calib-spearman")).to_contain_text(
        "needs ≥ 3 members; this sweep has 2")
    expect(page.locator("#calib-spearman")).not_to_contain_text("not yet")


def measure_queue(backend, queue):
    """A finished compute calibration and collective sweep on `queue`, stored as a worker
    stores them."""
    from backend import crud
    from backend.core.db import get_sessionmaker

    for preset, summary in (
            ("compute-calibration", {"kind": "compute_bench", "median_flops_per_s": 3.5e9,
                                     "model": {"arch": "mlp", "hidden": 256}, "batch": 32,
                                     "dtype": "float32", "world_size": 2,
                                     "device_name": "cpu", "results": [{"rank": 0}]}),
            ("collective-sweep", {"results": [{"op": "all_reduce", "bytes": 1 << 20,
                                               "busbw_GBps": 0.0478, "n": 2}]})):
        r = backend.http.post("/api/runs", json={"preset": preset, "runtime": {"queue": queue}})
        assert r.status_code == 201, r.text
        with get_sessionmaker(backend.env["DATABASE_URL"])() as db:
            crud.claim(db, r.json()["id"], worker="w", task_id=None)
            crud.finish(db, r.json()["id"], status="succeeded", exit_code=0, error=None,
                        summary=summary, provenance={})


def test_the_queue_s_measured_figures_are_offered_then_launched_without_warning(backend, page):
    measure_queue(backend, "measq")
    ready(page, backend.url)
    page.select_option("#a-arch", "mlp")
    for k, v in {"layers": "4", "hidden": "64", "global_batch": "8"}.items():
        page.fill(f"#a-{k}", v)
    small_cluster(page, queue="measq")
    page.click("#advise-go")
    banner = page.locator("#advise-assumed")
    expect(banner).to_contain_text("Queue “measq” has measured 47.8 MB/s")
    expect(banner).to_contain_text("3.50 GFLOP/s per device")
    page.click("#advise-use-measured")
    expect(banner).to_be_hidden()
    expect(page.locator("#a-tflops")).to_have_value("")
    expect(page.locator("#advise-sources [data-source='bandwidth']")).to_contain_text(
        "intra 47.8 MB/s, inter 47.8 MB/s: peak all_reduce busbw")
    expect(page.locator("#advise-sources [data-source='flops']")).to_contain_text(
        "3.500 GFLOP/s per device: median achieved FLOP/s of compute calibration run")

    sent = []

    def fake(route):
        sent.append(route.request.post_data_json)
        route.fulfill(status=201, content_type="application/json",
                      body=json.dumps({"id": "sw-m"}))
    page.route("**/api/sweeps", fake)
    page.fill("#launch-k", "3")
    expect(page.locator("#launch-note")).to_be_hidden()
    page.click("#launch-go")  # measured figures: one click launches
    expect(page.locator("#launch-status")).to_contain_text("sw-m")
    expect(page.locator("#launch-warning")).to_be_hidden()
    assert sent[0]["queue"] == "measq"
    assert sent[0]["cluster"] == {"intra_GBps": 0.0478, "inter_GBps": 0.0478, "flops": 3.5e9}
