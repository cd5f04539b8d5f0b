"""The new-run form with kind `script` (frontend/static/js/new_script.js, docs/dashboard.md):
a working-directory archive chosen in the form is uploaded at once and confirmed, its .py files
are offered as the entry, the arguments are one per line (a list, never one shell string), and
the run submitted from the form runs the script to success with exactly that spec. An archive
the server refuses is explained at the field, naming the member."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.support.archives import tgz

SCRIPT = Path(__file__).resolve().parents[1] / "data" / "scripts" / "ddp_linear.py"
RUN_DONE_S = 240  # a 2-rank torchrun job on a loaded 2-core machine
pytestmark = pytest.mark.slow  # runs a torchrun job, like tests/service/test_script_runs.py


def _script_form(svc, page):
    page.goto(f"{svc.url}/new?preset=ddp")
    expect(page.locator("#f-parallel-dp")).to_have_value("2")
    page.select_option("#f-kind", "script")
    expect(page.locator("fieldset[data-section='script']")).to_be_visible()
    expect(page.locator("fieldset[data-section='model']")).to_be_hidden()


def test_script_run_from_the_form_reaches_succeeded(svc, page):
    _script_form(svc, page)
    page.fill("#name", "my script from the form")
    page.fill("#f-runtime-queue", svc.queue)  # the fixture's worker
    archive = tgz({"ddp_linear.py": SCRIPT.read_bytes(), "README": b"not a script\n"})
    page.set_input_files("#f-script-upload-file", files=[{
        "name": "work.tar.gz", "mimeType": "application/gzip", "buffer": archive}])
    status = page.locator("#f-script-upload-status")
    expect(status).to_have_attribute("data-state", "done")
    expect(status).to_contain_text("uploaded: 2 files, sha256 ")
    sha = status.get_attribute("data-sha256")
    assert len(sha) == 64
    # the server's own record of the upload (not the page's) names the hash shown
    up = svc.http.get(f"/api/uploads/{sha}").json()
    assert sorted(up["entries"]) == ["README", "ddp_linear.py"]
    expect(status).to_contain_text(f"sha256 {sha[:12]}…")
    expect(page.locator("#f-script-upload")).to_have_value(sha)
    # the entry is offered from the upload: its .py files only
    options = page.locator("#f-script-entry-list option")
    expect(options).to_have_count(1)
    assert options.first.get_attribute("value") == "ddp_linear.py"
    page.fill("#f-script-entry", "ddp_linear.py")
    page.fill("#f-script-args", "--steps\n3")
    expect(page.locator("#submit")).to_be_enabled()
    page.click("#submit")
    page.wait_for_function("() => location.pathname.startsWith('/runs/') || "
                           "document.getElementById('form-error')?.textContent")
    assert "/runs/" in page.url, page.locator("#form-error").text_content()
    run_id = page.url.rstrip("/").split("/")[-1]
    done = svc.wait_status(run_id, ("succeeded", "failed", "hung"), RUN_DONE_S)
    assert done["status"] == "succeeded", svc.logs()
    script = svc.run(run_id)["spec"]["script"]
    assert script["args"] == ["--steps", "3"]  # two arguments, not one "--steps 3"
    assert script["entry"] == "ddp_linear.py"
    assert script["upload"] == sha
    assert svc.run(run_id)["kind"] == "script"


def test_a_refused_archive_is_explained_at_the_field(svc, page):
    _script_form(svc, page)
    bad = tgz({"ok.py": b"print('hi')\n", "../evil.py": b"print('out')\n"})
    page.set_input_files("#f-script-upload-file", files=[{
        "name": "bad.tar.gz", "mimeType": "application/gzip", "buffer": bad}])
    status = page.locator("#f-script-upload-status")
    expect(status).to_have_attribute("data-state", "error")
    expect(status).to_contain_text("../evil.py")
    expect(status).to_have_attribute("role", "alert")
    # nothing was set: the spec names no upload
    expect(page.locator("#f-script-upload")).to_have_value("")


def test_args_and_env_lines_are_sent_as_a_list_and_an_object(svc, page):
    """The form sends args line by line (spaces and quotes kept: no shell splitting) and env
    NAME=value lines as an object (split at the first '='); a name the server refuses is shown
    inline at script.env (the existing inline error mechanism)."""
    _script_form(svc, page)
    page.fill("#f-script-entry", "train.py")
    page.fill("#f-script-env", "MY_FLAG=a b=c\nLD_PRELOAD=x.so\n")
    field = page.locator(".field[data-field='script.env']")
    expect(field.locator(".msg")).to_contain_text("LD_PRELOAD")
    expect(page.locator("#f-script-env")).to_have_attribute("aria-invalid", "true")
    page.fill("#f-script-env", "MY_FLAG=a b=c\n")
    with page.expect_request(lambda r: r.url.endswith("/api/predict")) as req:
        page.fill("#f-script-args", "--name\n'two words'\n\n")
    body = json.loads(req.value.post_data)
    script = body.get("spec", body)["script"]
    assert script["args"] == ["--name", "'two words'"]
    assert script["env"] == {"MY_FLAG": "a b=c"}
    expect(field.locator(".msg")).to_have_text("")
    expect(page.locator("#f-script-env")).to_have_attribute("aria-invalid", "false")
