"""MoE on the dashboard (issue 17 part 7): the moe-ep preset through the new-run form (the MoE
fields come from GET /api/spec, errors inline), the run page's expert-load heat map showing the
expert a router bias makes hot, the all-to-all matrix over the EP ranks, and ep / experts /
top_k among the compare page's layout rows. One real 2-rank run."""

from __future__ import annotations

import secrets

from playwright.sync_api import expect

from tests.frontend.browser import shot

RUN_DONE_S = 240
HOT = 2  # the expert the router bias below makes hot


def test_moe_ep_run_from_the_form_shows_the_hot_expert_and_the_matrix(svc, page):
    page.goto(f"{svc.url}/new?preset=moe-ep")
    expect(page.locator("#f-parallel-ep")).to_have_value("2")
    expect(page.locator("#f-model-experts")).to_have_value("4")
    for f in ("top_k", "capacity_factor", "capacity_scope", "aux_loss_coef", "router_bias",
              "shared_expert"):
        expect(page.locator(f"#f-model-{f}")).to_have_count(1)
    page.fill("#name", "moe-ep from the form")
    page.fill("#f-train-steps", "3")
    page.fill("#f-runtime-queue", svc.queue)
    page.wait_for_selector("#pred-memory[data-ready='1']")
    # a wrong ep is explained at its field (both rules it breaks), and blocks submit
    page.fill("#f-parallel-ep", "3")
    ep = page.locator("[data-field='parallel.ep']")
    expect(ep.locator(".msg")).to_contain_text("must divide dp = 2")
    expect(ep.locator(".msg")).to_contain_text("must divide model.experts = 4")
    expect(page.locator("#f-parallel-ep")).to_have_attribute("aria-invalid", "true")
    expect(page.locator("#submit")).to_be_disabled()
    page.fill("#f-parallel-ep", "2")
    expect(page.locator("#submit")).to_be_enabled()
    page.fill("#f-model-router_bias", "9:1")
    expect(page.locator("[data-field='model.router_bias'] .msg")).to_contain_text(
        "outside 0..3")
    page.fill("#f-model-router_bias", f"{HOT}:3")
    expect(page.locator("#submit")).to_be_enabled()
    expect(page.locator("[data-field='model.router_bias'] .msg")).to_have_text("")
    page.click("#submit")
    page.wait_for_function("() => location.pathname.startsWith('/runs/') || "
                           "document.getElementById('form-error')?.textContent")
    assert "/runs/" in page.url, page.locator("#form-error").text_content()
    run_id = page.url.rstrip("/").split("/")[-1]
    assert svc.wait_status(run_id, ("succeeded", "failed"), RUN_DONE_S)["status"] == "succeeded"
    run = svc.run(run_id)
    assert run["spec"]["model"]["router_bias"] == f"{HOT}:3" and run["spec"]["parallel"]["ep"] == 2

    page.goto(f"{svc.url}/runs/{run_id}")
    page.wait_for_selector("body[data-charts-ready='1']", timeout=60_000)
    expect(page.locator("#moe-section")).to_be_visible()
    load = page.locator("#moe-load")
    expect(load).to_have_attribute("data-ready", "1")
    expect(load).to_have_attribute("data-hottest-expert", str(HOT))
    expect(load).to_have_attribute("data-experts", "4")
    # one layer alone shows the same hot expert (the bias is on every MoE block's router)
    page.select_option("#moe-layer", "0")
    expect(load).to_have_attribute("data-layer", "0")
    expect(load).to_have_attribute("data-hottest-expert", str(HOT))
    m = svc.http.get(f"/api/runs/{run_id}/metrics").json()
    assert m["headline"]["hottest_expert"] == HOT
    expect(page.locator("#moe-summary")).to_contain_text(f"hottest expert {HOT}")
    a2a = page.locator("#moe-a2a")
    expect(a2a).to_have_attribute("data-ranks", "0,1")
    assert {(r["src"], r["dst"]) for r in m["tables"]["all_to_all"]} == \
        {(0, 0), (0, 1), (1, 0), (1, 1)}
    ticks = page.eval_on_selector("#moe-a2a", "d => d.data[0].x")
    assert ticks == ["rank 0", "rank 1"]
    page.select_option("#moe-step", "1")
    expect(a2a).to_have_attribute("data-ranks", "0,1")
    shot(page, "run-moe-ep")

    # compare: the layout rows lead and name ep, experts and top_k, also when identical
    idle = {"queue": f"nobody-{secrets.token_hex(3)}"}  # no worker: it stays queued
    dense = svc.http.post("/api/runs", json={"preset": "ddp", "name": "dense", "runtime": idle})
    assert dense.status_code == 201, dense.text
    ring = svc.http.post("/api/runs", json={"preset": "cp", "name": "ring", "runtime": idle})
    assert ring.status_code == 201, ring.text
    page.goto(f"{svc.url}/compare?ids={run_id},{dense.json()['id']},{ring.json()['id']}")
    page.wait_for_selector("#config-diff tr.diff")
    row = page.locator("#config-diff tr[data-field='ep'] td")
    expect(row).to_have_text(["ep", "2", "1", "1"])
    expect(page.locator("#config-diff tr[data-field='cp'] td")).to_have_text(
        ["cp", "1", "1", "2"])
    expect(page.locator("#config-diff tr[data-field='experts'] td")).to_have_text(
        ["experts", "4", "none", "none"])
    expect(page.locator("#config-diff tr[data-field='top_k'] td")).to_have_text(
        ["top_k", "2", "–", "–"])
    deg = page.locator("#config-diff tr[data-field='degrees'] td")
    expect(deg.nth(1)).to_have_text("dp2·tp1·pp1·ep2")
    expect(deg.nth(3)).to_have_text("dp2·tp1·pp1·cp2")
