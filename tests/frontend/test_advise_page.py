"""The advisor page (/advise) in Chromium against a real backend: the ranked table and its
breakdown bars for the timed model on one host, a 422 next to its field, user strings shown as
text, the body "launch top k as a sweep" POSTs to /api/sweeps (intercepted, then for real:
each member stored with the advisor's breakdown), and a failed launch is shown."""

from __future__ import annotations

import json

import pytest
from playwright.sync_api import expect

from jobs.spec import deep_merge, parse_spec
from tests.conftest import backend_only_service
from tests.frontend.browser import shot


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    yield from backend_only_service(tmp_path_factory.mktemp("advise"))


def fill_timed(page):
    page.select_option("#a-arch", "timed")
    for k, v in {"layers": "8", "hidden": "8", "t_forward": "0.02", "t_backward_input": "0.01",
                 "t_backward_weight": "0.01", "global_batch": "8", "hosts": "1",
                 "devices_per_host": "4", "memory": "16", "intra": "2", "inter": "1",
                 "top": "10"}.items():
        page.fill(f"#a-{k}", v)


def test_advise_page_table_bars_errors_and_sweep_body(backend, page):
    page.goto(f"{backend.url}/advise")
    expect(page.locator("nav a[data-nav='advise']")).to_have_attribute("aria-current", "page")
    expect(page.locator("body")).to_have_attribute("data-ready", "1")
    fill_timed(page)
    page.click("#advise-go")
    rows = page.locator("#advise-table tbody tr")
    expect(rows.first).to_be_visible()
    n = rows.count()
    assert 6 <= n <= 10
    expect(page.locator("#advise-bars")).to_have_attribute("data-ready", "1")
    names = page.evaluate("() => document.getElementById('advise-bars').data.map(t => t.name)")
    assert names[:2] == ["compute", "bubble"]
    expect(page.locator("#advise-counts")).to_contain_text("layouts considered")
    expect(page.locator("#advise-conventions")).to_contain_text("configured times")
    # the cells read in scaled units; their data-s holds the seconds
    steps = [float(s) for s in page.locator("#advise-table tbody tr td:nth-child(3)")
             .evaluate_all("tds => tds.map(td => td.dataset.s)")]
    assert steps == sorted(steps)
    shot(page, "advise")

    # launch top 3: the request body the page sends (intercepted, answered 201)
    sent = []

    def fake(route):
        sent.append(route.request.post_data_json)
        route.fulfill(status=201, content_type="application/json",
                      body=json.dumps({"id": "sw-1"}))
    page.route("**/api/sweeps", fake)
    page.fill("#launch-k", "3")
    page.fill("#launch-name", "adv <b>x</b>")
    # the typed bandwidths are assumed hardware: the first click warns, the second launches
    page.click("#launch-go")
    expect(page.locator("#launch-warning")).to_contain_text("ASSUMED 2.00 GB/s intra-host")
    assert sent == []
    page.click("#launch-go")
    expect(page.locator("#launch-status")).to_contain_text("sw-1")
    body = sent[0]
    assert body["name"] == "adv <b>x</b>" and len(body["members"]) == 3
    first = page.locator("#advise-table tbody tr").first.get_attribute("data-label")
    assert body["base"]["name"] == f"advise-{first}" and body["members"][0] == {}
    # the members are what each candidate changes in the base, with the advisor's cluster
    labels = page.locator("#advise-table tbody tr").evaluate_all(
        "rs => rs.slice(0, 3).map(r => r.dataset.label)")
    for m, label in zip(body["members"], labels, strict=True):
        spec = parse_spec(deep_merge(body["base"], m), max_world_size=4, require_available=True)
        assert spec.name == f"advise-{label}"
    assert {k: body["cluster"][k] for k in ("intra_GBps", "inter_GBps")} == \
        {"intra_GBps": 2, "inter_GBps": 1}
    page.unroute("**/api/sweeps")

    # the real endpoint: the sweep is stored with the page's members, linked from the status
    page.click("#launch-go")
    expect(page.locator("#launch-status a")).to_have_count(1)
    sweep_id = page.locator("#launch-status a").text_content()
    got = backend.http.get(f"/api/sweeps/{sweep_id}").json()
    assert got["name"] == "adv <b>x</b>" and len(got["members"]) == 3, got
    # each member stored the advisor's breakdown at the page's cluster: the calibration
    steps = [float(s) for s in page.locator("#advise-table tbody tr td:nth-child(3)")
             .evaluate_all("tds => tds.map(td => td.dataset.s)")][:3]
    assert [m["predicted"]["step_time_s"] for m in got["members"]] == pytest.approx(
        steps, rel=0.01)
    assert got["calibration"]["n"] == 0 and len(got["calibration"]["rows"]) == 3

    # a refused launch is shown as an error
    page.route("**/api/sweeps", lambda route: route.fulfill(
        status=422, content_type="application/json",
        body=json.dumps({"detail": [{"loc": ["body", "members"], "msg": "too many"}]})))
    page.click("#launch-go")
    expect(page.locator("#launch-status")).to_contain_text("could not launch the sweep")
    expect(page.locator("#launch-status")).to_have_class("error")


def test_advise_page_422_next_to_field_and_escaped(backend, page):
    page.goto(f"{backend.url}/advise")
    expect(page.locator("body")).to_have_attribute("data-ready", "1")
    fill_timed(page)
    page.fill("#a-hosts", "0")
    page.click("#advise-go")
    field = page.locator(".field[data-field='cluster.hosts']")
    expect(field).to_have_class("field invalid")
    expect(field.locator(".msg")).to_contain_text("greater than or equal to 1")
    # a queue name with markup: the 422 quoting it is text, never markup
    page.fill("#a-hosts", "1")
    page.fill("#a-intra", "")
    page.fill("#a-inter", "")
    evil = "<img src=x onerror=alert(1)>"
    page.fill("#a-queue", evil)
    page.click("#advise-go")
    msg = page.locator(".field[data-field='queue'] .msg")
    expect(msg).to_contain_text("no collective sweep")
    assert evil in msg.text_content()
    assert page.locator("#advise-form img").count() == 0


def test_advise_page_names_the_flops_source(backend, page):
    """mlp with the TFLOP/s field empty and a queue: the queue's compute calibration (stored
    like the worker stores one) and its sweep give the figures; the page names both sources."""
    from backend import crud
    from backend.core.db import get_sessionmaker

    runs = {}
    for preset, summary in (
            ("compute-calibration", {"kind": "compute_bench", "median_flops_per_s": 3.5e9,
                                     "model": {"arch": "mlp", "hidden": 256}, "batch": 32,
                                     "dtype": "float32", "world_size": 2,
                                     "device_name": "cpu", "results": [{"rank": 0}]}),
            ("collective-sweep", {"results": [{"op": "all_reduce", "bytes": 1 << 20,
                                               "busbw_GBps": 1.5, "n": 2}]})):
        r = backend.http.post("/api/runs", json={"preset": preset,
                                                 "runtime": {"queue": "pageq"}})
        assert r.status_code == 201, r.text
        runs[preset] = r.json()["id"]
        with get_sessionmaker(backend.env["DATABASE_URL"])() as db:
            crud.claim(db, runs[preset], worker="w", task_id=None)
            crud.finish(db, runs[preset], status="succeeded", exit_code=0, error=None,
                        summary=summary, provenance={})
    page.goto(f"{backend.url}/advise")
    expect(page.locator("body")).to_have_attribute("data-ready", "1")
    page.select_option("#a-arch", "mlp")
    for k, v in {"layers": "4", "hidden": "64", "global_batch": "8", "hosts": "1",
                 "devices_per_host": "2", "memory": "16", "intra": "", "inter": "",
                 "tflops": "", "queue": "pageq", "top": "5"}.items():
        page.fill(f"#a-{k}", v)
    page.click("#advise-go")
    expect(page.locator("#advise-table tbody tr").first).to_be_visible()
    flops = page.locator("#advise-sources [data-source='flops']")
    expect(flops).to_contain_text("3.500 GFLOP/s per device")
    expect(flops).to_contain_text(f"compute calibration run {runs['compute-calibration']} on "
                                  "queue 'pageq' (model shape mlp hidden 256")
    expect(page.locator("#advise-sources [data-source='bandwidth']")).to_contain_text(
        f"collective sweep {runs['collective-sweep']}")


def test_new_run_form_launches_a_calibration(backend, page):
    """The new-run form with the compute-calibration preset: the model and compute sections,
    not the parallel / train / collective ones; the spec it submits is the calibration's."""
    page.goto(f"{backend.url}/new?preset=compute-calibration")
    expect(page.locator("#f-compute-batch")).to_have_value("32")
    expect(page.locator("#f-model-hidden")).to_be_visible()
    for s in ("parallel", "train", "collective"):
        expect(page.locator(f"fieldset[data-section='{s}']")).to_be_hidden()
    page.fill("#f-compute-iters", "4")
    page.click("#submit")
    page.wait_for_function("() => location.pathname.startsWith('/runs/')")
    run = backend.http.get(f"/api/runs/{page.url.rsplit('/', 1)[1]}").json()
    assert run["kind"] == "compute_bench" and run["strategy"] == "compute-calibration"
    assert run["spec"]["compute"]["iters"] == 4
