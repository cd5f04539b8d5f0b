"""The run page of a run that went wrong (#15), in Chromium on the real service: a hung run's
page leads with the one-sentence diagnosis, then each rank's state and stacks; its complete
checkpoints are offered, and the Resume button creates a run linked to it that continues.
The new-run form adds a fault with one click, and a bad fault is named inline."""

from __future__ import annotations

from playwright.sync_api import expect

from tests.conftest import wait_for
from tests.frontend.browser import shot

HUNG = {"preset": "dp-allreduce", "name": "hangs at step 3",
        "model": {"arch": "mlp", "hidden": 8, "layers": 2},
        "train": {"steps": 5, "global_batch": 8, "optimizer": "sgd", "checkpoint_every": 1},
        "runtime": {"hang_timeout_s": 4},
        "faults": [{"kind": "hang", "ranks": [1], "step": 3, "op": "all_reduce"}]}


def test_a_hung_run_page_leads_with_the_diagnosis_and_resumes(svc, page):
    rid = svc.submit(HUNG)["id"]
    run = svc.wait_status(rid, ("hung", "failed", "succeeded", "timed_out"), 240)
    assert run["status"] == "hung", run["error"]
    run = wait_for(lambda: (r := svc.run(rid))["summary"] is not None and r, 60, "summary")
    sentence = run["summary"]["diagnosis"]["sentence"]
    assert sentence.startswith("rank 1 never entered all_reduce #12 of group dp [0, 1]")

    page.goto(f"{svc.url}/runs/{rid}")
    expect(page.locator("#diagnosis-sentence")).to_have_text(sentence)
    # first: above every figure of the page (timeline, memory, ...)
    top = page.locator("#diagnosis-section").bounding_box()["y"]
    for sec in ("#gantt-section", "#memory-section", "#log-section"):
        assert top < page.locator(sec).bounding_box()["y"], sec
    rows = page.locator("#diagnosis-ranks tbody tr")
    expect(rows).to_have_count(2)
    expect(rows.nth(0)).to_contain_text("waiting in all_reduce #12")
    expect(page.locator("#diagnosis-mismatch")).to_contain_text("position #12")
    expect(page.locator("#diagnosis-stacks details")).not_to_have_count(0)
    expect(page.locator("#run-faults")).to_contain_text("hang on rank 1 at step 3")
    shot(page, "run-hung")

    # complete checkpoints of the steps before the hang; the latest is preselected
    expect(page.locator("#resume-step option")).to_have_count(3)
    assert page.locator("#resume-step").input_value() == "3"
    page.select_option("#resume-step", "2")
    page.click("#resume-btn")
    page.wait_for_url(lambda url: f"/runs/{rid}" not in url, timeout=60_000)
    child_id = page.url.rstrip("/").split("/")[-1]
    child = svc.run(child_id)
    assert child["parent_id"] == rid and child["spec"]["resume"] == {"run_id": rid, "step": 2}
    assert child["spec"]["faults"] == []  # the parent's injected fault stays with it
    expect(page.locator("#parent-link a")).to_have_attribute("href", f"/runs/{rid}")
    done = svc.wait_status(child_id, ("succeeded", "failed", "hung"), 240)
    assert done["status"] == "succeeded", done["error"]


def test_the_new_run_form_adds_faults_in_one_click_and_names_bad_ones(svc, page):
    page.goto(f"{svc.url}/new?preset=ddp")
    page.wait_for_selector("#f-faults")
    page.click("button[data-fault='slow']")
    assert '"kind":"slow"' in page.locator("#f-faults").input_value()
    page.fill("#f-faults", '[{"kind": "hang", "ranks": [7], "step": 1}]')
    expect(page.locator("#f-faults-msg")).to_contain_text("faults.0.ranks: rank 7 does not "
                                                          "exist")
    page.fill("#f-faults", "[{")
    expect(page.locator("#f-faults-msg")).to_contain_text("not valid JSON")


def test_a_restarted_run_shows_each_attempt_and_its_cause(svc, page):
    """A real crash fault on attempt 0 (faults fire on the attempt they name): torchrun restarts
    the job (runtime.max_restarts), which continues from its last complete checkpoint."""
    rid = svc.submit({"preset": "ddp", "name": "crash then restart",
                      "model": {"arch": "mlp", "hidden": 8, "layers": 2},
                      "train": {"steps": 5, "global_batch": 8, "checkpoint_every": 1},
                      "runtime": {"max_restarts": 1},
                      "faults": [{"kind": "crash", "ranks": [1], "step": 3}]})["id"]
    done = svc.wait_status(rid, ("succeeded", "failed", "hung"), 240)
    assert done["status"] == "succeeded", done["error"]
    run = wait_for(lambda: (r := svc.run(rid))["summary"] is not None and r, 60, "summary")
    tries = run["summary"]["attempts"]
    assert [t["attempt"] for t in tries] == [0, 1]
    assert run["summary"]["start_step"] == 3  # attempt 1 loaded the checkpoint of 3 steps
    page.goto(f"{svc.url}/runs/{rid}")
    items = page.locator("#attempts li")
    expect(items).to_have_count(2)
    expect(items.nth(0)).to_contain_text("attempt 0: rank 1: InjectedCrash")
    expect(items.nth(1)).to_contain_text("attempt 1: completed")
    expect(page.locator("#diagnosis-section")).to_be_visible()
