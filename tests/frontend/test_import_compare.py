"""An imported run compares like any run (issue 40), in Chromium: two imports (HTA's public ViT
traces and a gloo job's CPU traces, both real) and a paralab ddp run side by side on /compare:
a verdict per figure naming the runs, each run's step time and overlap as its own analysis
states them (GET /api/runs/{id}/metrics), the layout diff showing the kind."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import expect

from jobs.units import fmt
from tests.conftest import FINISHED, wait_for
from tests.frontend.browser import shot
from tests.kineto.test_gloo_cpu import gloo_traces  # noqa: F401 (fixture)

VIT = Path(__file__).resolve().parents[1] / "data" / "kineto" / "vit_2rank"
pytestmark = pytest.mark.slow


def _import(svc, name: str, paths, **form) -> dict:
    files = [("files", (Path(p).name, Path(p).read_bytes())) for p in paths]
    r = svc.http.post("/api/imports", data={"name": name, **form}, files=files, timeout=300)
    assert r.status_code == 201, r.text
    return r.json()


@pytest.fixture(scope="module")
def runs(svc, gloo_traces):  # noqa: F811
    vit = _import(svc, "vit import", sorted(VIT.glob("*.json.gz")), allow_missing_ranks="true")
    gloo = _import(svc, "gloo import", gloo_traces)
    r = svc.http.post("/api/runs", json={"preset": "ddp", "name": "ddp preset",
                                         "model": {"arch": "mlp"}, "train": {"steps": 3},
                                         "runtime": {"queue": svc.queue}})
    assert r.status_code == 201, r.text
    rid = r.json()["id"]
    wait_for(lambda: svc.http.get(f"/api/runs/{rid}").json()["status"] in FINISHED, 240,
             "the ddp run")
    return {"vit": vit, "gloo": gloo, "ddp": svc.http.get(f"/api/runs/{rid}").json()}


def test_imports_and_a_preset_compare(svc, runs, page):
    ids = [runs[k]["id"] for k in ("vit", "gloo", "ddp")]
    assert runs["ddp"]["status"] == "succeeded"
    page.goto(f"{svc.url}/compare?ids={','.join(ids)}")
    expect(page.locator("#cmp-table thead th.num")).to_have_count(3)
    step = page.locator("#cmp-table tr[data-figure='step_time_s']")
    for i, rid in enumerate(ids):
        h = svc.http.get(f"/api/runs/{rid}/metrics").json()["headline"]
        cell = step.locator("td.num").nth(i)
        expect(cell).to_contain_text(fmt(h["step_time_s"], "s"))
    # a verdict per figure against the first run (the ViT import), naming the runs
    verdict = page.locator("#cmp-table tr[data-figure='step_time_s'] .verdict")
    expect(verdict).to_have_count(2)
    expect(verdict.first).to_contain_text("vit import")
    diff = page.locator("#config-diff tr[data-field='kind']")
    expect(diff).to_contain_text("import")
    expect(diff).to_contain_text("train")
    shot(page, "compare-imports")
