"""One figure, one definition, on every page (issue 37, items 2, 5 and 10), with real runs.

Peak memory: on a zero2 run the run page's card, its memory chart's stacked total, the runs
list, the compare page, the memory table's CSV and the API's column all show the same number,
and it equals a hand computation from the downloaded trace files (per rank, the sum of every
component's peak, communication buffers included). Before, the card, the list and compare left
the buffers out (173 kB against the chart's 272 kB).

The bubble: the timeline header's "measured" figure is the bubble card's, also after the page
draws a newer analysis (a stopped run's partial analysis, then its stored one). Before, the
header kept the first analysis' figure until a reload.

The throughput of an MLP run is labelled samples/s, on the card and in the CSV.

A cancelled run's half-finished last step is neither plotted nor in throughput.csv (before, it
drew a 6x tokens/s spike)."""

from __future__ import annotations

import csv
import io
import json
import re

import pytest
from playwright.sync_api import expect

from jobs.units import fmt
from tests.analysis.test_partial_step import cancelled_run

RUN_DONE_S = 240
PARTS = ("params", "grads", "optimizer", "activations", "recv_buffers", "gathered_peak",
         "comm_buffers")


@pytest.fixture(scope="module")
def runs(svc):
    ids = {"zero2": svc.submit({"preset": "zero2", "name": "one peak zero2",
                                "train": {"steps": 3}})["id"],
           "ddp": svc.submit({"preset": "ddp", "name": "one peak ddp",
                              "train": {"steps": 3}})["id"],
           "pp": svc.submit({"preset": "pp-1f1b", "name": "one bubble pp",
                             "train": {"steps": 4}})["id"]}
    for rid in ids.values():
        assert svc.wait_status(rid, ("succeeded", "failed"), RUN_DONE_S)["status"] == "succeeded"
    return ids


def by_hand(svc, rid: str, world: int) -> int:
    """max over ranks of Σ_component (max over the rank's `mem` samples), from the files."""
    best = 0
    for rank in range(world):
        text = svc.http.get(f"/api/runs/{rid}/files/trace-rank{rank}.jsonl").text
        peak: dict[str, int] = {}
        for line in text.splitlines():
            r = json.loads(line)
            if r.get("type") == "mem":
                for k in PARTS:
                    if isinstance(r.get(k), int):
                        peak[k] = max(peak.get(k, 0), r[k])
        best = max(best, sum(peak.values()))
    return best


def test_peak_memory_is_one_number_everywhere(svc, runs, page):
    rid = runs["zero2"]
    want = by_hand(svc, rid, 2)
    m = svc.http.get(f"/api/runs/{rid}/metrics").json()
    assert m["headline"]["peak_memory_bytes"] == want
    assert any(r["component"] == "comm_buffers" and r["measured_bytes"]
               for r in m["tables"]["memory"])  # the buffers are part of it
    assert svc.run(rid)["peak_memory_bytes"] == want  # the list's column
    text = svc.http.get(f"/api/runs/{rid}/export",
                        params={"format": "csv", "table": "memory"}).text
    totals = [int(r["measured_bytes"]) for r in csv.DictReader(io.StringIO(text))
              if r["component"] == "total"]
    assert max(totals) == want

    page.goto(f"{svc.url}/runs/{rid}")
    page.wait_for_selector("body[data-charts-ready='1']")
    card = page.locator("#cards [data-key='peak_memory_bytes']")
    assert int(float(card.get_attribute("data-value"))) == want
    expect(card).to_contain_text(fmt(want, "B"))
    expect(card).to_contain_text("buffers")  # the card says what it sums
    chart = page.locator("#memory-chart")
    expect(chart).to_have_attribute("data-peak-bytes", str(want))
    # the bars themselves stack to it: the busiest rank's measured column, in the axis' unit
    stacked = page.evaluate("""() => {
        const d = document.getElementById('memory-chart');
        const n = d.data[0].y.length;
        const cols = [...Array(n).keys()].filter((i) => i % 2 === 0);  // measured columns
        const sums = cols.map((i) => d.data.reduce((s, t) => s + (t.y[i] || 0), 0));
        return [Math.max(...sums), d.layout.yaxis.title.text];
    }""")
    unit = re.search(r"\((\w*)B\)", stacked[1]).group(1)
    div = {"": 1, "k": 1e3, "M": 1e6, "G": 1e9}[unit]
    assert stacked[0] * div == pytest.approx(want, rel=1e-9)

    page.goto(f"{svc.url}/?q=one%20peak")
    row = page.locator(f"#runs tr[data-run-id='{rid}']")
    expect(row).to_be_visible()
    col = page.evaluate("""() => [...document.querySelectorAll('#runs thead th')]
        .findIndex((th) => th.dataset.sort === 'peak_memory_bytes')""")
    expect(row.locator("td").nth(col)).to_have_text(fmt(want, "B"))

    ids = [runs["zero2"], runs["ddp"]]
    page.goto(f"{svc.url}/compare?ids={','.join(ids)}")
    page.wait_for_selector("body[data-charts-ready='1']")
    cells = page.locator("#cmp-table tr[data-figure='peak_memory_bytes'] td.num")
    assert int(float(cells.nth(0).get_attribute("data-value"))) == want
    ddp = svc.http.get(f"/api/runs/{runs['ddp']}/metrics").json()["headline"]
    assert int(float(cells.nth(1).get_attribute("data-value"))) == ddp["peak_memory_bytes"] \
        == by_hand(svc, runs["ddp"], 2)


def test_mlp_throughput_says_samples_per_second(svc, runs, page):
    rid = runs["ddp"]
    h = svc.http.get(f"/api/runs/{rid}/metrics").json()["headline"]
    assert h["throughput_unit"] == "samples/s"
    page.goto(f"{svc.url}/runs/{rid}")
    page.wait_for_selector("body[data-charts-ready='1']")
    expect(page.locator("#cards [data-key='tokens_per_s']")).to_contain_text(
        fmt(h["tokens_per_s"], "samples/s"))
    text = svc.http.get(f"/api/runs/{rid}/export",
                        params={"format": "csv", "table": "throughput"}).text
    assert text.split("\n", 1)[0].split(",")[:5] == \
        ["step", "step_s", "ranks", "samples", "samples_per_s"]


def test_the_timeline_header_follows_the_bubble_card(svc, runs, page):
    """The page first gets a partial analysis whose bubble is 34.1 % (as a stopped run's
    first look does), then, once the run's report is in, the stored one: the header must
    move with the card."""
    rid = runs["pp"]
    real = svc.http.get(f"/api/runs/{rid}/metrics").json()
    true_bubble = real["headline"]["bubble_fraction"]
    assert true_bubble is not None and abs(true_bubble - 0.341) > 0.01
    served = {"n": 0}

    def metrics(route):
        served["n"] += 1
        if served["n"] > 1:
            route.continue_()
            return
        stale = json.loads(json.dumps(real))
        stale["partial"] = True
        stale["headline"]["bubble_fraction"] = 0.341
        stale["tables"]["headline"] = [stale["headline"]]
        route.fulfill(status=200, content_type="application/json", body=json.dumps(stale))
    page.route(re.compile(rf".*/api/runs/{rid}/metrics(\?.*)?$"), metrics)
    page.goto(f"{svc.url}/runs/{rid}")
    expect(page.locator("body")).to_have_attribute("data-analysis", "final", timeout=60_000)
    card = page.locator("#cards [data-key='bubble_fraction']")
    expect(card).to_have_attribute("data-value", str(true_bubble))
    expect(page.locator("#gantt-info")).to_contain_text(f"measured {fmt(true_bubble * 100, '%')}")
    expect(page.locator("#gantt")).to_have_attribute("data-measured-bubble", str(true_bubble))
    # the time axis is in the unit of its largest time: never "49.3k ms"
    ticks = page.evaluate("() => document.getElementById('gantt').layout.xaxis")
    assert ticks.get("exponentformat") == "none"


def test_a_cancelled_runs_unfinished_step_is_not_plotted(svc, page):
    """A run cancelled while queued, given the traces of a run cut short mid-step (as a worker
    uploads them): the page draws the partial analysis, steps 0-3 only."""
    run = svc.submit({"preset": "ddp", "name": "cut short",
                      "runtime": {"queue": "nobody", "nproc_per_node": 2},
                      "parallel": {"dp": 2}, "train": {"global_batch": 8}})
    rid = run["id"]
    assert svc.http.post(f"/api/runs/{rid}/cancel").status_code == 200
    svc.wait_status(rid, "cancelled", 30)
    cancelled_run(svc.tmp / "var" / "runs" / rid, last_on_rank1=False)
    text = svc.http.get(f"/api/runs/{rid}/export",
                        params={"format": "csv", "table": "throughput"}).text
    assert [r["step"] for r in csv.DictReader(io.StringIO(text))] == ["0", "1", "2", "3"]
    page.goto(f"{svc.url}/runs/{rid}")
    page.wait_for_selector("body[data-charts-ready='1']")
    expect(page.locator("#throughput-chart")).to_have_attribute("data-ready", "1")
    xs = page.evaluate("""() => document.getElementById('throughput-chart').data
        .filter((t) => t.meta !== 'parent').map((t) => t.x)""")
    assert xs and all(x == [0, 1, 2, 3] for x in xs), xs
