"""The sweep pages in Chromium against the backend alone (no worker: the members stay queued,
so this costs no runs; docs/sweeps.md): every member in the table, sorting, the
parallel-coordinates plot, the invalid member's reason, user strings shown as text."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.conftest import backend_only_service
from tests.frontend.browser import shot

EVIL = "<script>alert(1)</script><img src=x onerror=alert(2)>"


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    yield from backend_only_service(tmp_path_factory.mktemp("sweep-page"))


@pytest.fixture(scope="module")
def sweep(svc) -> dict:
    r = svc.http.post("/api/sweeps", json={
        "name": EVIL, "base": {"preset": "ddp", "model": {"arch": "mlp"}},
        "members": [{"parallel": {"zero_stage": z}} for z in (0, 2, 3)]
        + [{"parallel": {"dp": 3}}]})
    assert r.status_code == 201, r.text
    return r.json()


def order(page) -> list[int]:
    return [int(i) for i in page.locator("#sweep-members tbody tr").evaluate_all(
        "rows => rows.map(r => r.dataset.index)")]


def test_sweep_page_table_sort_plot_reason_and_escaping(svc, sweep, page):
    page.goto(f"{svc.url}/sweeps/{sweep['id']}")
    expect(page.locator("#sweep-members tbody tr")).to_have_count(4)
    expect(page.locator("#sweep-name")).to_have_text(EVIL)
    assert page.locator("main img").count() == 0 and page.locator("main script").count() == 0
    bad = page.locator("#sweep-members tr[data-status='invalid']")
    expect(bad).to_have_count(1)
    expect(bad.locator("td[data-col='reason']")).to_contain_text(
        sweep["members"][3]["errors"][0]["msg"])
    # sort by predicted peak memory per rank: ZeRO-3 below DDP = ZeRO-2 (its gradient saving
    # spent on the reduce-scatter buffer; ties by index); the invalid member last either way
    page.click("th[data-sort='pred_peak_memory_bytes']")
    assert order(page) == [2, 0, 1, 3]
    page.click("th[data-sort='pred_peak_memory_bytes']")
    assert order(page) == [0, 1, 2, 3]
    page.click("th[data-sort='overrides']")
    assert order(page) == [3, 0, 1, 2]  # parallel.dp=3 sorts before parallel.zero_stage=...
    plot = page.locator("#sweep-parcoords[data-ready='1']")
    expect(plot).to_have_count(1)
    dims = plot.evaluate("d => d.data[0].dimensions.map(x => x.label)")
    # readable labels with units, a tick per value typed, never "null" (issue 37 item 9)
    assert dims[0] == "zero stage (parallel)", dims
    assert any(d.startswith("peak mem / rank, predicted (") and d.endswith("B)") for d in dims)
    ticks = plot.evaluate("d => d.data[0].dimensions[0].ticktext")
    assert ticks == ["0", "2", "3"]
    assert "null" not in page.locator("#sweep-parcoords").text_content()
    assert plot.evaluate("d => d.data[0].type") == "parcoords"
    assert page.locator("#sweep-parcoords .parcoords").count() > 0  # drawn, not only data
    expect(page.locator("#sweep-cancel")).to_be_visible()
    shot(page, "sweep-page")
    page.click("#sweep-cancel")
    expect(page.locator("#sweep-status")).to_have_text("cancelled")
    expect(page.locator("#sweep-cancel")).to_be_hidden()


def test_sweeps_list_reachable_from_the_nav(svc, sweep, page):
    page.goto(f"{svc.url}/")
    page.click("nav a[data-nav='sweeps']")
    row = page.locator(f"#sweeps-table tr[data-id='{sweep['id']}']")
    expect(row.locator("a")).to_have_text(EVIL)
    assert page.locator("main img").count() == 0
    row.locator("a").click()
    expect(page.locator("#sweep-members tbody tr")).to_have_count(4)
    page.goto(f"{svc.url}/sweeps/nope")
    expect(page.locator("main")).to_contain_text("not found")


def test_sweep_from_the_advisor_restates_its_ranking_as_measured(svc, page, tmp_path):
    """A sweep with the advisor's cluster stores each member's breakdown; once the members have
    measured figures (written into the runs' key-figure columns here, as the worker's finish
    report would: no worker in this fixture) the page re-states the ranking: members by
    measured step, predicted rank beside it, Spearman and the error per term."""
    import json
    import sqlite3

    from jobs.theory.advisor import advise
    cluster = {"hosts": 1, "devices_per_host": 2, "device_memory_bytes": 8e9,
               "intra_GBps": 2.0, "inter_GBps": 1.0}
    adv = advise({"arch": "timed", "layers": 4, "hidden": 8, "t_forward": 0.01,
                  "t_backward_input": 0.01, "t_backward_weight": 0.01}, 8, cluster, top=50)
    picked, seen = [], set()
    for c in adv["candidates"]:  # four distinct predicted step times
        key = round(c["predicted"]["step_s"], 4)
        if key not in seen:
            seen.add(key)
            picked.append(c)
    picked = picked[:4]
    assert len(picked) == 4
    r = svc.http.post("/api/sweeps", json={
        "name": "advisor", "base": picked[0]["spec"], "members": [c["spec"] for c in picked],
        "cluster": {"intra_GBps": 2.0, "inter_GBps": 1.0}})
    assert r.status_code == 201, r.text
    sw = r.json()
    assert sw["calibration"]["n"] == 0 and sw["calibration"]["spearman"] is None
    for m, c in zip(sw["members"], picked, strict=True):  # the advisor's numbers, stored
        assert m["predicted"]["step_time_s"] == pytest.approx(c["predicted"]["step_s"])
        assert m["predicted"]["compute_s"] == pytest.approx(c["predicted"]["compute_s"])
        assert m["predicted"]["intra_GBps"] == 2.0
    # measured: the predicted order with members 1 and 2 swapped -> rho = 0.8 over four
    steps = [c["predicted"]["step_s"] * 1.1 for c in picked]
    steps[1], steps[2] = steps[2], steps[1]
    db = sqlite3.connect(svc.tmp / "p.db")
    for m, s in zip(sw["members"], steps, strict=True):
        head = {"step_time_s": s, "compute_s": s * 0.6, "bubble_s": None,
                "exposed_comm_s": s * 0.1, "idle_s": s * 0.05}
        db.execute("UPDATE runs SET status='succeeded', step_time_s=?, exposed_comm_s=?, "
                   "metrics=? WHERE id=?", (s, s * 0.1, json.dumps(head), m["run_id"]))
    db.commit()
    db.close()
    cal = svc.http.get(f"/api/sweeps/{sw['id']}").json()["calibration"]
    assert cal["n"] == 4 and cal["spearman"] == pytest.approx(0.8)
    assert [r["index"] for r in cal["rows"]] == [0, 2, 1, 3]
    assert cal["terms"]["step"]["mean_error_s"] == pytest.approx(
        sum(c["predicted"]["step_s"] - s for c, s in zip(picked, steps, strict=True)) / 4)
    page.goto(f"{svc.url}/sweeps/{sw['id']}")
    expect(page.locator("#sweep-calibration")).to_be_visible()
    expect(page.locator("#calib-spearman")).to_contain_text("over 4 members: 0.800")
    rows = page.locator("#calib-rows tbody tr")
    expect(rows).to_have_count(4)
    assert rows.evaluate_all("rs => rs.map(r => r.dataset.index)") == ["0", "2", "1", "3"]
    assert rows.nth(1).locator("td").nth(1).text_content() == "3"  # predicted rank 3, measured 2
    expect(page.locator("#calib-terms tr[data-term='step'] td").nth(1)).to_have_text("4")
    shot(page, "sweep-calibration")


def test_plain_sweep_has_no_calibration(svc, sweep, page):
    assert svc.http.get(f"/api/sweeps/{sweep['id']}").json()["calibration"] is None
    page.goto(f"{svc.url}/sweeps/{sweep['id']}")
    expect(page.locator("#sweep-members tbody tr")).to_have_count(4)
    expect(page.locator("#sweep-calibration")).to_be_hidden()
    # a member's run page links back to its sweep
    run_id = sweep["members"][0]["run_id"]
    assert svc.http.get(f"/api/runs/{run_id}").json()["sweep_id"] == sweep["id"]
    page.goto(f"{svc.url}/runs/{run_id}")
    link = page.locator("#run-sweep-link")
    expect(link).to_have_text(sweep["id"])
    link.click()
    expect(page.locator("#sweep-name")).to_have_text(EVIL)
