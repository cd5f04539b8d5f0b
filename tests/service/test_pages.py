"""The pages: one base template (nav bar once, skip link, <main id="content">), every element id
the scripts and browser tests use still there (a snapshot of the pages before the base
template), ETag / 304, and a missing page is an HTML 404."""

from __future__ import annotations

import re
import secrets
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from backend.main import create_app

TEMPLATES = Path(__file__).resolve().parents[2] / "frontend" / "templates"
# Element ids of each page as served before the pages shared base.html (the JS and the browser
# tests look these up); the base template adds only "content". Since then: the runs list's
# peak-memory filter (f-mem-max), the device-memory explanation (device-gb-help), the run
# page's hang diagnosis and resume (#15), the cluster page (#16), bounded tracing's predicted
# trace size (pred-trace), traced-steps line (trace-coverage) and the large tables' sampling
# note (table-sampling) (#19); the run page's health block and section title (run-health,
# diagnosis-title), the sweep builder (sb-*) and compare's caption
# and noise rule (cmp-caption, cmp-noise), the new-run form's loading note (form-loading) and
# the advisor's model line, progress, assumed-hardware banner and launch notes (#37); the
# import page and the run page's imported figures (imported-section) (#40).
IDS = {
    "/cluster": ["cluster-error", "cluster-updated", "hosts", "hosts-empty", "queued",
                 "queued-empty", "queues", "unseen"],
    "/collectives": ["coll-chart", "coll-error", "coll-time", "sweeps"],
    "/compare": ["cmp-axis", "cmp-base", "cmp-caption", "cmp-loss", "cmp-memory", "cmp-noise",
                 "cmp-steps", "cmp-table", "cmp-timelines", "compare-error", "compare-form",
                 "compare-ids", "config-diff", "show-all"],
    "/": ["compare-btn", "f-mem-max", "f-owner", "f-status", "f-strategy", "f-tag", "filters",
          "first", "limit", "list-error", "next", "page-info", "prev", "q", "runs"],
    "/new": ["device-gb", "device-gb-help", "fields", "form-error", "form-loading", "form-title",
             "limits", "name",
             "new-run", "notes",
             "pred-cards", "pred-comm", "pred-formulas", "pred-links", "pred-links-caption",
             "pred-memory", "pred-status", "pred-trace", "prediction", "preset", "preset-title",
             "submit",
             "tags", "whatif-inter", "whatif-intra", "whatif-nnodes"],
    "/runs/abc": ["cancel-btn", "cards", "clone-link", "comm-axis", "comm-busbw",
                  "comm-links", "comm-overlap", "comm-section", "curves-section", "diagnosis",
                  "diagnosis-section", "diagnosis-title", "downloads", "gantt",
                  "gantt-detail", "gantt-export", "gantt-info", "gantt-reset", "gantt-search",
                  "gantt-section",
                  "gantt-step", "hosts", "hosts-section", "imported-section", "log",
                  "log-info", "log-rank",
                  "log-section", "loss-chart", "memory-chart", "memory-section", "memory-table",
                  "moe-a2a", "moe-layer", "moe-load", "moe-section", "moe-step", "moe-summary",
                  "resume", "resume-section",
                  "run-error", "run-head", "run-health",
                  "run-meta", "run-status", "run-sweep", "run-sweep-link", "run-title",
                  "table-sampling", "throughput-chart", "trace-coverage"],
    "/advise": ["a-arch", "a-devices_per_host", "a-global_batch", "a-heads", "a-hidden",
        "a-hosts", "a-inter", "a-intra", "a-layers", "a-memory", "a-preset", "a-preset-extra",
        "a-queue",
        "a-seq_len", "a-t_backward_input", "a-t_backward_weight", "a-t_forward", "a-tflops",
        "a-top", "a-vocab", "advise-assumed", "advise-bars", "advise-conventions",
        "advise-counts", "advise-error", "advise-form", "advise-go", "advise-model",
        "advise-progress", "advise-results", "advise-sources", "advise-table", "launch-form",
        "launch-go", "launch-k", "launch-name", "launch-note", "launch-status",
        "launch-warning"],
    "/sweeps": ["sb-add-axis", "sb-axes", "sb-base-kind", "sb-base-msg", "sb-count",
                "sb-errors", "sb-form", "sb-launch", "sb-name", "sb-preset", "sb-run", "sb-status",
                "sb-title", "sweeps-error", "sweeps-filters", "sweeps-q", "sweeps-status",
                "sweeps-table"],
    "/import": ["drop-zone", "err-allow_missing_ranks", "err-files", "err-name", "err-notes",
                "err-tags", "file-list", "file-total", "files-label", "form-error", "imp-files",
                "imp-missing", "imp-name", "imp-notes", "imp-tags", "import-form", "progress-box",
                "progress-text", "submit", "upload-progress"],
    "/schedules": ["s-m", "s-p", "s-schedule", "s-t_b_input", "s-t_b_weight", "s-t_comm", "s-t_f",
                   "s-v", "sched-actions", "sched-cards", "sched-convention", "sched-error",
                   "sched-form", "sched-gantt", "sched-results", "sched-status"],
}
SCRIPTS = {"/cluster": "cluster.js", "/collectives": "collectives.js", "/compare": "compare.js",
           "/": "runs.js", "/new": "new.js", "/runs/abc": "run.js", "/schedules": "schedules.js",
           "/advise": "advise.js", "/sweeps": "sweep_list.js", "/import": "import.js"}



@pytest.mark.parametrize("path", list(IDS))
def test_every_page_keeps_its_ids_and_shares_the_base(client, path):
    if path == "/runs/abc":  # a run that exists (an unknown one is a 404 page)
        path = f"/runs/{client.post('/api/runs', json={'preset': 'ddp'}).json()['id']}"
    r = client.get(path)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    ids = re.findall(r'\bid="([^"]+)"', r.text)
    assert len(ids) == len(set(ids)), "duplicate ids"
    assert sorted(set(ids) - {"content"}) == IDS["/runs/abc" if path.startswith("/runs/") else path]
    assert r.text.count("<nav") == 1 and r.text.count('data-nav="') == 9
    assert '<a class="skip-link" href="#content">Skip to content</a>' in r.text
    assert r.text.count('<main id="content"') == 1
    script = SCRIPTS["/runs/abc" if path.startswith("/runs/") else path]
    assert f'<script type="module" src="/static/js/{script}"></script>' in r.text
    assert ("/static/vendor/plotly.min.js" in r.text) == (path not in ("/", "/cluster",
                                                                        "/sweeps", "/import"))
    assert "{%" not in r.text and "{{" not in r.text


def test_an_unknown_run_is_an_html_404(client):
    r = client.get("/runs/nosuchrun")
    assert r.status_code == 404 and r.headers["content-type"].startswith("text/html")
    assert "nosuchrun" in r.text and 'id="run-title"' not in r.text


def test_the_nav_bar_is_written_once_in_the_templates():
    pages = sorted(p for p in TEMPLATES.glob("*.html") if p.name != "base.html")
    assert len(pages) == 13  # the twelve pages and the 404 page
    for page in pages:
        text = page.read_text()
        assert text.startswith('{% extends "base.html" %}'), page.name
        assert "<nav" not in text and "<html" not in text, page.name
    assert (TEMPLATES / "base.html").read_text().count("<nav") == 1


def test_etag_revalidation_answers_304(client):
    first = client.get("/compare")
    etag = first.headers["etag"]
    assert first.headers["cache-control"] == "no-cache"
    again = client.get("/compare", headers={"If-None-Match": etag})
    assert again.status_code == 304 and again.content == b"" and again.headers["etag"] == etag
    assert client.get("/compare", headers={"If-None-Match": '"other"'}).status_code == 200


def test_login_page_in_team_mode_has_no_nav_and_its_csp(tmp_path, db_url):
    from backend.core.config import Settings
    s = Settings(data_dir=tmp_path / "v", database_url=db_url, worker_token="w" * 40,
                 auth="required", secret_key=secrets.token_hex(32))
    with TestClient(create_app(s)) as team:
        r = team.get("/login")
    assert r.status_code == 200 and 'id="login-form"' in r.text and "<nav" not in r.text
    assert sorted(set(re.findall(r'\bid="([^"]+)"', r.text)) - {"content"}) == [
        "login", "login-error", "login-form", "login-submit", "password", "username"]
    assert "frame-ancestors 'none'" in r.headers["content-security-policy"]
    assert r.headers["cache-control"] == "no-store"
