"""The import page (/import) and an import run's page, in Chromium on the real service: the
public ViT traces (tests/data/kineto/vit_2rank, ranks 0 and 1 of 128) chosen with the file
picker, uploaded with progress shown, land on the run page whose imported figures are the
numbers GET /api/runs/{id}/metrics returns, and those are HTA's own (hta_expected.json,
written by HTA 0.5.0: the oracle is not the code under test). A bad file (dropped on the drop
zone, or a truncated JSON) is refused with the error next to the file list, naming the file,
while the name, tags, notes and chosen files are kept; removing the bad file and importing
again succeeds. Every user string reaches the page as text (a file named like an HTML tag
with an `alert` would open a dialog, which fails the test: conftest's `page`)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.conftest import backend_only_service
from tests.frontend.browser import shot
from tests.kineto.test_gloo_cpu import gloo_traces  # noqa: F401 (fixture)

ROOT = Path(__file__).resolve().parents[2]
VIT = sorted((ROOT / "tests" / "data" / "kineto" / "vit_2rank").glob("rank-*.json.gz"))
HTA = json.loads((ROOT / "tests" / "kineto" / "hta_expected.json").read_text())["sets"]
NAME = 'vit <b>bold</b> & "quoted"'  # shown as typed, never as markup
EVIL = "<img src=x onerror=alert(1)>.txt"


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    """The backend alone: an import is analysed in the request, no worker takes part."""
    yield from backend_only_service(tmp_path_factory.mktemp("imports"))


def rule_shown(text: str) -> str:
    return "HTA's definition: " + (text[len("HTA: "):] if text.startswith("HTA: ") else text)


def cells(page, table: str) -> list[dict]:
    """Each row of a table on the page: {column: the raw value its cell carries}."""
    return page.evaluate("""(sel) => [...document.querySelectorAll(sel + ' tbody tr')].map(
        tr => Object.fromEntries([...tr.querySelectorAll('td')].map(
            td => [td.dataset.col, {value: td.dataset.value, text: td.textContent}])))""",
                         f"#{table}")


def as_number(v: str):
    return None if v == "" else float(v)


def test_vit_traces_import_and_the_run_page_shows_htas_figures(svc, page):
    page.goto(f"{svc.url}/import")
    expect(page.locator("body[data-ready='1']")).to_have_count(1)
    expect(page.locator("nav a[data-nav='import']")).to_have_attribute("aria-current", "page")
    page.fill("#imp-name", NAME)
    page.fill("#imp-tags", "gpu, hta")
    page.fill("#imp-notes", "two ranks of *128*")
    page.set_input_files("#imp-files", [str(p) for p in VIT])
    items = page.locator("#file-list li")
    expect(items).to_have_count(2)
    assert [(i.get_attribute("data-name"), int(i.get_attribute("data-size")))
            for i in items.all()] == [(p.name, p.stat().st_size) for p in VIT]
    expect(items.first.locator(".file-size")).to_have_text(
        f"{VIT[0].stat().st_size / 1000:.0f} kB")
    # without "allow missing ranks" the server refuses: 126 of the 128 ranks are missing
    page.click("#submit")
    expect(page.locator("#err-files")).to_contain_text("ranks 2-127 of world size 128 are missing")
    bar = page.locator("#upload-progress")
    # the whole body was sent before the answer: the bar is full, bytes sent / total shown
    total = int(bar.get_attribute("data-total"))
    assert total >= sum(p.stat().st_size for p in VIT)
    assert int(bar.get_attribute("data-loaded")) == total
    expect(page.locator("#progress-text")).to_contain_text(" sent (100 %)")
    expect(page.locator("#progress-text")).to_contain_text("refused (HTTP 422)")
    assert page.input_value("#imp-name") == NAME
    expect(items).to_have_count(2)

    page.check("#imp-missing")
    # hold the answer: while the server analyses, the page says so under the full bar
    phases: list[str] = []
    page.expose_function("notePhase", lambda p: phases.append(p))
    page.evaluate("""() => new MutationObserver(() => window.notePhase(
        document.querySelector('#progress-box').dataset.phase || '')).observe(
        document.querySelector('#progress-box'), {attributes: true})""")
    page.click("#submit")
    page.wait_for_url("**/runs/*", timeout=120_000)
    assert "uploading" in phases and "analysing" in phases, phases
    rid = page.url.rstrip("/").split("/")[-1]
    run = svc.run(rid)
    assert (run["kind"], run["status"], run["name"]) == ("import", "succeeded", NAME)
    a = svc.http.get(f"/api/runs/{rid}/metrics").json()
    k = a["kineto"]

    expect(page.locator("#imported-section[data-ready='1']")).to_have_count(1)
    expect(page.locator("#run-title")).to_have_text(NAME)
    assert page.locator("#run-title b, #imported-section b").count() == 0
    shot(page, "import-run-vit")
    # where the traces came from (summary.import)
    expect(page.locator("#import-files li")).to_have_text([p.name for p in VIT])
    expect(page.locator("#import-source dd[data-key='world_size']")).to_have_text("128")
    expect(page.locator("#import-source dd[data-key='backend']")).to_have_text("nccl")
    expect(page.locator("#cards [data-key='ranks']")).to_have_attribute("data-value", "2")

    # per rank: the API's numbers, and those are HTA's
    hta = HTA["vit_2rank"]
    rows = cells(page, "imp-temporal")
    assert [int(float(r["rank"]["value"])) for r in rows] == [t["rank"] for t in k["temporal"]]
    for row, api in zip(rows, k["temporal"], strict=True):
        for col, v in api.items():
            assert as_number(row[col]["value"]) == pytest.approx(v, abs=1e-9), (col, row)
        want = hta["temporal"][str(api["rank"])]
        assert float(row["compute_time_us"]["value"]) == want["compute_time_us"]
        assert float(row["idle_time_us"]["value"]) == want["idle_time_us"]
        assert row["idle_pct"]["text"] == f"{want['hta_idle_time_pctg']:.2f} %"
        assert row["compute_pct"]["text"] == f"{want['hta_compute_time_pctg']:.2f} %"
        assert row["non_compute_pct"]["text"] == f"{want['hta_non_compute_time_pctg']:.2f} %"
        assert row["overlap_pct"]["text"] == f"{hta['overlap_pct'][str(api['rank'])]:.2f} %"
        assert row["idle_time_us"]["text"] == f"{want['idle_time_us']:,} µs"
    # the stacked bars draw the same numbers
    drawn = page.evaluate("""() => Object.fromEntries(document.querySelector(
        '#imp-temporal-chart').data.map(t => [t.name, t.y]))""")
    for name, key in (("idle", "idle_pct"), ("compute", "compute_pct"),
                      ("non-compute", "non_compute_pct"),
                      ("overlap (% of communication time)", "overlap_pct")):
        assert drawn[name] == pytest.approx([t[key] for t in k["temporal"]]), name
    # kernel types: the API's rows, which are HTA's (with memory kernels)
    types = cells(page, "imp-kernel-types")
    assert [r["kernel_type"]["value"] for r in types] == [t["kernel_type"] for t in
                                                          k["kernel_types"]]
    assert {r["kernel_type"]["value"]: float(r["sum_us"]["value"]) for r in types} == \
        hta["kernel_types"]["with_memory"]
    top = cells(page, "imp-top-kernels")
    assert len(top) == len(k["top_kernels"]) > 0
    for row, api in zip(top, k["top_kernels"], strict=True):
        assert row["name"]["text"] == api["name"] and float(row["sum_us"]["value"]) == \
            api["sum_us"] and int(row["count"]["value"]) == api["count"]
    # any further list of the section (the kernel launches) is drawn whole, as the API has it
    for key, api_rows in k.items():
        if key in ("temporal", "kernel_types", "top_kernels") or not isinstance(api_rows, list):
            continue
        shown = cells(page, f"imp-{key}")
        assert len(shown) == len(api_rows), key
        for row, api in zip(shown, sorted(api_rows, key=lambda x: x.get("rank", 0)), strict=True):
            assert {c: as_number(v["value"]) for c, v in row.items()} == pytest.approx(api), key
    # each figure beside its rule, as the analysis words it (every rule somewhere)
    for key, text in k["rules"].items():
        expect(page.locator(f"#imported-section dd[data-rule='{key}']").first).to_have_text(
            rule_shown(text))
    expect(page.locator("#imp-temporal-figure dd[data-rule='overlap_pct']")).to_have_count(1)
    expect(page.locator("#imp-top-figure dd[data-rule='top_kernels']")).to_have_count(1)
    # the training sections have nothing for an import: hidden, not empty boxes
    expect(page.locator("#memory-section")).to_be_hidden()
    expect(page.locator("#curves-section")).to_be_hidden()


def test_a_bad_file_is_named_next_to_the_files_and_the_form_is_kept(svc, page, tmp_path):
    page.goto(f"{svc.url}/import")
    expect(page.locator("body[data-ready='1']")).to_have_count(1)
    page.fill("#imp-name", "keep this name")
    page.fill("#imp-tags", "a, b")
    page.fill("#imp-notes", "kept notes")
    # a file dropped on the zone (a DataTransfer, as a drag from the desktop delivers it)
    dt = page.evaluate_handle("""(name) => { const dt = new DataTransfer();
        dt.items.add(new File(['hello'], name, {type: 'text/plain'})); return dt; }""", EVIL)
    page.dispatch_event("#drop-zone", "drop", {"dataTransfer": dt})
    expect(page.locator("#file-list li")).to_have_count(1)
    page.click("#submit")
    err = page.locator("#err-files")
    expect(err).to_have_text(f"{EVIL}: not a trace file or archive (.json, .json.gz, .zip, "
                             ".tar.gz, .tgz)")
    expect(page.locator("#file-list li.bad .file-name")).to_have_text(EVIL)
    expect(page.locator(".field[data-field='files']")).to_have_class("field invalid")
    assert page.locator("#err-files img, #file-list img").count() == 0
    expect(page.locator("#progress-text")).to_contain_text("refused (HTTP 422)")

    # a JSON cut 40 bytes short: the error names the file and the byte where parsing failed
    whole = gzip.decompress(VIT[1].read_bytes())
    cut = tmp_path / "rank-1.json"
    cut.write_bytes(whole[: len(whole) - 40])
    page.click("#file-list li button")  # remove the dropped file
    page.set_input_files("#imp-files", [str(VIT[0]), str(cut)])
    page.check("#imp-missing")
    expect(page.locator("#file-list li")).to_have_count(2)
    page.click("#submit")
    expect(err).to_contain_text("rank-1.json: invalid JSON")
    expect(err).to_contain_text("of the file")
    assert not err.inner_text().startswith("files:")
    expect(page.locator("#file-list li.bad")).to_have_attribute("data-name", "rank-1.json")
    # nothing typed or chosen is lost
    assert page.input_value("#imp-name") == "keep this name"
    assert page.input_value("#imp-tags") == "a, b"
    assert page.input_value("#imp-notes") == "kept notes"
    assert page.is_checked("#imp-missing")
    expect(page.locator("#file-list li")).to_have_count(2)
    expect(page.locator("#err-name")).to_have_text("")
    shot(page, "import-bad-file")
    assert "keep this name" not in {r["name"] for r in svc.http.get("/api/runs").json()["items"]}

    # an empty name is said next to the name, before anything is uploaded
    page.fill("#imp-name", "")
    page.click("#submit")
    expect(page.locator("#err-name")).to_contain_text("required")
    expect(err).to_have_text("")

    # the bad file removed, the kept form imports rank 0 alone
    page.fill("#imp-name", "keep this name")
    page.click("#file-list li[data-name='rank-1.json'] button")
    expect(page.locator("#file-list li")).to_have_count(1)
    page.click("#submit")
    page.wait_for_url("**/runs/*", timeout=120_000)
    run = svc.run(page.url.rstrip("/").split("/")[-1])
    assert run["name"] == "keep this name" and sorted(run["tags"]) == ["a", "b"]
    assert run["summary"]["import"]["ranks"] == [0]


def test_a_cpu_profile_says_why_it_has_no_hta_figures(svc, page, gloo_traces):  # noqa: F811
    """A 2-rank gloo job traced on the CPU (tests/kineto/test_gloo_cpu.py): no GPU kernels, so
    no HTA figures; the page says so (the analysis' note) instead of drawing empty charts."""
    r = svc.http.post("/api/imports", data={"name": "gloo cpu"}, timeout=120, files=[
        ("files", (Path(p).name, Path(p).read_bytes())) for p in gloo_traces])
    assert r.status_code == 201, r.text
    rid = r.json()["id"]
    note = svc.http.get(f"/api/runs/{rid}/metrics").json()["kineto"]["note"]
    page.goto(f"{svc.url}/runs/{rid}")
    expect(page.locator("#imported-section[data-ready='1']")).to_have_count(1)
    expect(page.locator("#imported-note")).to_have_text(note)
    expect(page.locator("#imp-temporal-chart")).to_have_text("no GPU kernels in these traces")
    expect(page.locator("#imp-temporal tbody tr")).to_have_count(0)
    expect(page.locator("#import-source dd[data-key='backend']")).to_have_text("gloo")
    expect(page.locator("#import-files li")).to_have_text([Path(p).name for p in gloo_traces])
    # the engine's sections the traces fed stay: collectives matched across the two ranks
    # (bandwidth, links) and the allocator's memory; no loss was logged: no curves
    expect(page.locator("#comm-section")).to_be_visible()
    expect(page.locator("#memory-section")).to_be_visible()
    expect(page.locator("#curves-section")).to_be_hidden()
    shot(page, "import-run-gloo")
