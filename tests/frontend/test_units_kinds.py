"""One formatter for throughput and one colour per meaning (issue 37, item 10), in Chromium:
units.js `rateUnit` labels a throughput by model kind (tok/s for a gpt, samples/s for an mlp:
the analysis headline's `throughput_unit`, jobs/analysis/labels.py), `fmtThroughput` scales it
like every other figure (3.88 ktok/s, never "3,875 tok/s" on one page and "3.87 ktok/s" on the
next), and charts.js gives a mesh axis the same colour whatever other axes a run has."""

from __future__ import annotations

import pytest

from jobs.analysis.labels import rate_unit
from jobs.units import fmt
from tests.conftest import ROOT
from tests.frontend.browser import chromium_browser

JS = ROOT / "frontend" / "static" / "js"


@pytest.fixture(scope="module")
def browser():
    yield from chromium_browser()


def evaluate(browser, script: str):
    page = browser.new_page()

    def serve(route):
        name = route.request.url.rsplit("/", 1)[-1]
        route.fulfill(path=str(JS / name), content_type="text/javascript")
    page.route("http://units.test/js/*", serve)
    page.route("http://units.test/", lambda r: r.fulfill(
        body="<html><script>window.Plotly = {};</script></html>", content_type="text/html"))
    page.goto("http://units.test/")
    try:
        return page.evaluate(script)
    finally:
        page.close()


def test_throughput_is_labelled_by_model_kind_and_formatted_once(browser):
    got = evaluate(browser, """async () => {
        const u = await import("/js/units.js");
        return {
          units: [u.rateUnit("gpt"), u.rateUnit("mlp"), u.rateUnit("timed"),
                  u.rateUnit({ throughput_unit: "samples/s" }),
                  u.rateUnit({ model: { arch: "gpt" } }), u.rateUnit(null)],
          text: [u.fmtThroughput(3875.4, { throughput_unit: "tok/s" }),
                 u.fmtThroughput(3875.4, { throughput_unit: "samples/s" }),
                 u.fmtThroughput(null, "gpt")],
        };
    }""")
    # the same rule as the analysis' (the CSV headers, the headline)
    assert got["units"][:3] == [rate_unit({"model": {"arch": a}}) for a in ("gpt", "mlp", "timed")]
    assert got["units"][3:] == ["samples/s", "tok/s", "tok/s"]
    assert got["text"] == [fmt(3875.4, "tok/s"), fmt(3875.4, "samples/s"), "–"]
    assert got["text"][0] == "3.88 ktok/s"


def test_an_axis_keeps_its_colour_whatever_the_other_axes(browser):
    got = evaluate(browser, """async () => {
        const c = await import("/js/charts.js");
        return { dp: [c.colorOf("dp"), c.colorOf("dp")], tp: c.colorOf("tp"),
                 pp: c.colorOf("pp"), odd: [c.colorOf("pp:send:1"), c.colorOf("pp:send:1")] };
    }""")
    assert got["dp"][0] == got["dp"][1] and len({got["dp"][0], got["tp"], got["pp"]}) == 3
    assert got["odd"][0] == got["odd"][1]


def test_the_bandwidth_and_axis_charts_colour_by_axis_not_by_order(browser):
    got = evaluate(browser, """async () => {
        const m = await import("/js/comm.js");
        const c = await import("/js/charts.js");
        const row = (op, axis) => ({ op, axis, payload_bytes: 1e6, busbw_GBps: 1,
                                     instances: 1, duration_median_s: 1e-3 });
        const a = m.busbwTraces([row("all_reduce", "dp")]);
        const b = m.busbwTraces([row("all_reduce", "tp"), row("all_reduce", "dp")]);
        return { a: a[0].line.color, b: b.map((t) => [t.name, t.line.color]),
                 dp: c.AXIS_COLORS.dp };
    }""")
    assert got["a"] == got["dp"]
    assert dict(got["b"])["all_reduce (dp)"] == got["dp"] != dict(got["b"])["all_reduce (tp)"]
