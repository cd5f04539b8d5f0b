"""`paralab import DIR --name ...` against a real backend over HTTP (backend only: an import
launches nothing): a trace folder as torch.profiler writes it becomes a run; a folder without
traces and a bad trace are answered with the file and the rule, exit code 2, nothing stored."""

from __future__ import annotations

import json
import shutil

import httpx
import pytest

from backend import cli
from tests.conftest import backend_only_service
from tests.kineto.test_gloo_cpu import STEPS, gloo_traces  # noqa: F401 (fixture)


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    yield from backend_only_service(tmp_path_factory.mktemp("cli-import"))


def run(monkeypatch, capsys, svc, *argv):
    monkeypatch.setenv("PARALAB_URL", svc.url)
    try:
        code = cli.main(list(argv))
    except SystemExit as exc:  # argparse
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


def runs(svc) -> list[dict]:
    return httpx.get(svc.url + "/api/runs").json()["items"]


def test_a_trace_folder_imports(svc, monkeypatch, capsys, tmp_path, gloo_traces):  # noqa: F811
    folder = tmp_path / "log" / "job"
    (folder / "sub").mkdir(parents=True)
    shutil.copy(gloo_traces[0], folder / "host_1.1733.pt.trace.json.gz")
    shutil.copy(gloo_traces[1], folder / "sub" / "host_2.1734.pt.trace.json.gz")
    (folder / "events.out.tfevents").write_text("not a trace")
    before = len(runs(svc))
    code, out, err = run(monkeypatch, capsys, svc, "import", str(tmp_path / "log"), "--name",
                         "from the cli", "--tag", "a", "--tag", "b", "--json")
    assert code == 0, err
    r = json.loads(out)
    assert (r["kind"], r["status"], r["world_size"], sorted(r["tags"])) == \
        ("import", "succeeded", 2, ["a", "b"])
    a = httpx.get(f"{svc.url}/api/runs/{r['id']}/metrics").json()
    assert sorted({x["step"] for x in a["tables"]["step_rank"]}) == list(range(STEPS))
    assert len(runs(svc)) == before + 1


def test_refusals_name_the_file(svc, monkeypatch, capsys, tmp_path, gloo_traces):  # noqa: F811
    before = len(runs(svc))
    (tmp_path / "empty").mkdir()
    code, _, err = run(monkeypatch, capsys, svc, "import", str(tmp_path / "empty"), "--name", "x")
    assert code == 2 and "no .json or .json.gz trace files in this folder" in err
    code, _, err = run(monkeypatch, capsys, svc, "import", gloo_traces[0], "--name", "x")
    assert code == 2 and "files: ranks 1 of world size 2 are missing" in err
    bad = tmp_path / "rank-1.json"
    bad.write_text('{"traceEvents": [')
    code, _, err = run(monkeypatch, capsys, svc, "import", gloo_traces[0], str(bad), "--name", "x")
    assert code == 2 and "rank-1.json: " in err and "rejected (422)" in err
    code, _, err = run(monkeypatch, capsys, svc, "import", gloo_traces[0], "--name", "x",
                       "--allow-missing-ranks")
    assert code == 0, err
    assert len(runs(svc)) == before + 1
