"""One rule for human-readable numbers (issue 13): jobs/units.py (CLI) and
frontend/static/js/units.js (every chart axis, card and table) answer the same snapshot, from
1e-6 to 1e12, linear and log axes; the JavaScript runs in Chromium."""

from __future__ import annotations

import json
import math

import pytest

from jobs.units import fmt
from tests.conftest import ROOT
from tests.frontend.browser import chromium_browser

SNAPSHOT = json.loads((ROOT / "tests" / "data" / "units_snapshot.json").read_text())
JS = ROOT / "frontend" / "static" / "js"


def _value(case):
    return math.nan if case["nan"] else case["value"]


def test_python_formatter_matches_the_snapshot():
    bad = [(c, fmt(_value(c), c["unit"], trim=c["trim"])) for c in SNAPSHOT["fmt"]
           if fmt(_value(c), c["unit"], trim=c["trim"]) != c["text"]]
    assert bad == []


def test_snapshot_reads_as_promised():
    t = {(c["value"], c["unit"], c["trim"]): c["text"] for c in SNAPSHOT["fmt"] if not c["nan"]}
    assert t[(3.2e9, "B", False)] == "3.20 GB" and t[(1e12, "B", False)] == "1.00 TB"
    assert t[(1.5e-6, "s", False)] == "1.50 µs" and t[(1000, "s", False)] == "16.7 min"
    assert t[(999960, "B", True)] == "1 MB" and t[(None, "B", False)] == "–"
    assert t[(12.34, "%", False)] == "12.3 %" and t[(512, "B", False)] == "512 B"
    logs = {(c["unit"], c["lo"], c["hi"]): c["ticktext"] for c in SNAPSHOT["axis_log"]}
    assert logs[("B", 1024, 1 << 20)] == ["1 kB", "10 kB", "100 kB", "1 MB", "10 MB"]
    assert logs[("s", 1e-6, 1e-3)] == ["1 µs", "10 µs", "100 µs", "1 ms"]
    lin = {(c["unit"], c["max"]): c["name"] for c in SNAPSHOT["axis_linear"]}
    assert lin[("B", 3.2e9)] == "GB" and lin[("s", 4e4)] == "min" and lin[("s", 3e-4)] == "µs"


@pytest.fixture(scope="module")
def browser():
    yield from chromium_browser()


def test_javascript_formatter_and_axes_match_the_snapshot(browser):
    page = browser.new_page()

    def serve(route):
        name = route.request.url.rsplit("/", 1)[-1]
        route.fulfill(path=str(JS / name), content_type="text/javascript")
    page.route("http://units.test/js/*", serve)
    page.route("http://units.test/", lambda r: r.fulfill(body="<html></html>",
                                                          content_type="text/html"))
    page.goto("http://units.test/")
    got = page.evaluate("""async (snap) => {
        const u = await import("/js/units.js");
        return {
          fmt: snap.fmt.map((c) => u.fmt(c.nan ? NaN : c.value, c.unit, { trim: c.trim })),
          lin: snap.axis_linear.map((c) => {
            const a = u.axisUnit([0, c.max / 2, c.max], c.unit);
            return [a.div, a.unit, a.title("x")]; }),
          log: snap.axis_log.map((c) => {
            const a = u.logAxis(c.lo, c.hi, c.unit); return [a.tickvals, a.ticktext]; }),
        };
    }""", SNAPSHOT)
    page.close()
    assert got["fmt"] == [c["text"] for c in SNAPSHOT["fmt"]]
    assert got["lin"] == [[c["div"], c["name"], c["title"]] for c in SNAPSHOT["axis_linear"]]
    assert got["log"] == [[c["tickvals"], c["ticktext"]] for c in SNAPSHOT["axis_log"]]
