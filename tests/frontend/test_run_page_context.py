"""What the run page and the runs list say beside the figures (issue 37, items 4 and 10), in
Chromium on the real service: a queued run's page says why it waits (the cluster page's
reason) and shows placeholders, not empty charts; the cp degree is on the run page and in the
list; sorting the list by a performance figure does not rank a failed run among the good ones
and says so; a collective-sweep run shows its own cards, not empty training cards; the
slow-rank fault example says the steps it applies to."""

from __future__ import annotations

from playwright.sync_api import expect

from tests.conftest import wait_for

TINY = {"model": {"arch": "mlp", "hidden": 8, "layers": 2}}


def test_a_queued_run_says_why_it_waits_and_shows_every_degree(svc, page):
    # a queue no worker serves: the run stays queued (submitted around svc.submit, which
    # would put it on the fixture's own queue)
    r = svc.http.post("/api/runs", json={"preset": "cp", "name": "cp waits",
                                         "runtime": {"queue": "nobody-serves-this"}})
    assert r.status_code == 201, r.text
    rid = r.json()["id"]
    try:
        run = svc.run(rid)
        assert run["cp"] == 2 and run["status"] == "queued"
        assert run["wait_reason"].startswith("no live worker serves queue 'nobody-serves-this'")
        page.goto(f"{svc.url}/runs/{rid}")
        wait = page.locator("#run-health #run-wait")
        expect(wait).to_contain_text("no live worker serves queue 'nobody-serves-this'")
        expect(page.locator("#run-meta")).to_contain_text("dp2·tp1·pp1·cp2 = 2 ranks")
        # each chart says what it waits for instead of an empty box
        for box in ("#loss-chart", "#throughput-chart", "#memory-chart"):
            expect(page.locator(box)).to_have_text("waiting for the run to start…")

        page.goto(f"{svc.url}/?q={rid}")
        row = page.locator(f"#runs tbody tr[data-run-id='{rid}']")
        expect(row).to_contain_text("dp2·tp1·pp1·cp2 (2)")
    finally:
        svc.http.post(f"/api/runs/{rid}/cancel")


def test_sorting_by_a_figure_ranks_succeeded_runs_only_and_says_so(svc, page):
    # a crash at the last step: the failed run has a step time from the steps before it
    bad = svc.submit({"preset": "ddp", "name": "fails late", **TINY,
                      "train": {"steps": 4, "global_batch": 8},
                      "faults": [{"kind": "crash", "ranks": [1], "step": 3}]})["id"]
    good = svc.submit({"preset": "ddp", "name": "fine", **TINY,
                       "train": {"steps": 4, "global_batch": 8}})["id"]
    for rid, status in ((bad, "failed"), (good, "succeeded")):
        done = svc.wait_status(rid, ("succeeded", "failed", "hung"), 240)
        assert done["status"] == status, done["error"]
    wait_for(lambda: svc.run(bad)["step_time_s"] is not None, 60, "the failed run's figures")

    page.goto(f"{svc.url}/?sort=step_time_s")
    expect(page.locator(f"#runs tbody tr[data-run-id='{good}']")).to_be_visible()
    statuses = page.locator("#runs tbody tr").evaluate_all(
        "rows => rows.map((r) => r.dataset.status)")
    assert set(statuses) == {"succeeded"}, statuses
    expect(page.locator("#sort-note")).to_contain_text("succeeded runs only")
    # a status picked by hand is honoured: the failed run is listed, and no note
    page.select_option("#f-status", "failed")
    expect(page.locator(f"#runs tbody tr[data-run-id='{bad}']")).to_be_visible()
    expect(page.locator("#sort-note")).to_be_hidden()
    # sorting by creation time lists every run
    page.goto(f"{svc.url}/")
    expect(page.locator(f"#runs tbody tr[data-run-id='{bad}']")).to_be_visible()
    expect(page.locator("#sort-note")).to_be_hidden()


def test_a_collective_sweep_run_shows_only_what_applies(svc, page):
    rid = svc.submit({"preset": "collective-sweep", "name": "bench",
                      "collective": {"max_bytes": 4096, "iters": 2, "warmup": 1}})["id"]
    done = svc.wait_status(rid, ("succeeded", "failed"), 240)
    assert done["status"] == "succeeded", done["error"]
    page.goto(f"{svc.url}/runs/{rid}")
    cards = page.locator("#cards")
    expect(cards).to_have_attribute("data-kind", "collective_bench")
    expect(cards.locator("[data-key='all_correct'] .value")).to_have_text("all correct")
    labels = cards.locator(".label").all_inner_texts()
    for training in ("step time", "throughput", "bubble", "overlap", "straggler"):
        assert training not in labels, labels


def test_the_slow_rank_example_says_the_steps_it_applies_to(svc, page):
    ex = svc.http.get("/api/spec").json()["fault_examples"]["slow"]
    first, steps = ex["fault"]["step"], ex["fault"]["steps"]
    assert steps == 3  # what the button adds: 3 steps from `step`, not every step
    page.goto(f"{svc.url}/new?preset=ddp")
    button = page.locator("button[data-fault='slow']")
    expect(button).to_contain_text(f"steps {first}-{first + steps - 1}")
    assert "every step" not in button.inner_text()
