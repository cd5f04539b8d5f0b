"""An imported run compares like any run (issue 40), in Chromium: two imports (HTA's public ViT
traces and a gloo job's CPU traces, both real), a paralab ddp run and the user's own DDP script
(issue 41) side by side on /compare:
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
from tests.support.archives import tgz

VIT = Path(__file__).resolve().parents[1] / "data" / "kineto" / "vit_2rank"
SCRIPTS = Path(__file__).resolve().parents[1] / "data" / "scripts"
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
    # and the user's own DDP script (issue 41), run unmodified by the same worker
    up = svc.http.post("/api/uploads", files={"file": ("w.tar.gz", tgz(
        {"ddp_linear.py": (SCRIPTS / "ddp_linear.py").read_bytes()}))})
    assert up.status_code in (200, 201), up.text
    s = svc.submit({"kind": "script", "name": "my ddp script", "parallel": {"dp": 2},
                    "runtime": {"queue": svc.queue},
                    "script": {"entry": "ddp_linear.py", "upload": up.json()["sha256"],
                               "args": ["--steps", "3"]}})
    for run_id in (rid, s["id"]):
        wait_for(lambda i=run_id: svc.http.get(f"/api/runs/{i}").json()["status"] in FINISHED,
                 240, f"run {run_id}")
    return {"vit": vit, "gloo": gloo, "ddp": svc.http.get(f"/api/runs/{rid}").json(),
            "script": svc.http.get(f"/api/runs/{s['id']}").json()}



def test_imports_a_script_and_a_preset_compare(svc, runs, page):
    ids = [runs[k]["id"] for k in ("vit", "gloo", "ddp", "script")]
    assert runs["ddp"]["status"] == runs["script"]["status"] == "succeeded"
    page.goto(f"{svc.url}/compare?ids={','.join(ids)}")
    expect(page.locator("#cmp-table thead th.num")).to_have_count(4)
    step = page.locator("#cmp-table tr[data-figure='step_time_s']")
    for i, rid in enumerate(ids):
        h = svc.http.get(f"/api/runs/{rid}/metrics").json()["headline"]
        cell = step.locator("td.num").nth(i)
        expect(cell).to_contain_text(fmt(h["step_time_s"], "s"))
    # a verdict per figure against the first run (the ViT import), naming the runs
    verdict = page.locator("#cmp-table tr[data-figure='step_time_s'] .verdict")
    expect(verdict).to_have_count(3)
    expect(verdict.first).to_contain_text("vit import")
    diff = page.locator("#config-diff tr[data-field='kind']")
    expect(diff).to_contain_text("import")
    expect(diff).to_contain_text("train")
    expect(diff).to_contain_text("script")
    shot(page, "compare-imports")
