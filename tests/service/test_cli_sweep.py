"""`paralab sweep submit | show | list | cancel` against a real backend over HTTP (no worker:
the members stay queued, so this costs no runs): the printed table, --json, and a bad sweep
file answered with the field and the rule, exit code 2, nothing stored."""

from __future__ import annotations

import io
import json

import pytest

from backend import cli
from tests.conftest import backend_only_service

GRID = {"name": "cli grid", "base": {"preset": "ddp", "model": {"arch": "mlp"}},
        "grid": {"parallel.zero_stage": [0, 2], "train.steps": [2, 3]}}


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    yield from backend_only_service(tmp_path_factory.mktemp("cli-sweep"))


def run(monkeypatch, capsys, svc, *argv, stdin=""):
    monkeypatch.setenv("PARALAB_URL", svc.url)
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_submit_show_list_cancel(svc, monkeypatch, capsys, tmp_path):
    f = tmp_path / "grid.json"
    f.write_text(json.dumps(GRID))
    code, out, err = run(monkeypatch, capsys, svc, "sweep", "submit", str(f), "--json")
    assert code == 0, err
    s = json.loads(out)
    assert s["name"] == "cli grid" and s["counts"] == {"queued": 4, "total": 4}
    assert [m["overrides"] for m in s["members"]] == [
        {"parallel": {"zero_stage": z}, "train": {"steps": n}} for z in (0, 2) for n in (2, 3)]
    code, out, _ = run(monkeypatch, capsys, svc, "sweep", "show", s["id"])
    assert code == 0
    assert out.splitlines()[0].startswith(f"{s['id']}  cli grid  queued  (4 members: 4 queued)")
    assert f"page: {svc.url}/sweeps/{s['id']}" in out
    for m in s["members"]:
        assert m["run_id"] in out
    code, out, _ = run(monkeypatch, capsys, svc, "sweep", "list", "--json")
    assert code == 0 and s["id"] in [x["id"] for x in json.loads(out)["items"]]
    code, out, _ = run(monkeypatch, capsys, svc, "sweep", "list")
    assert code == 0 and s["id"] in out and "cli grid" in out
    code, out, _ = run(monkeypatch, capsys, svc, "sweep", "cancel", s["id"], "--json")
    assert code == 0 and json.loads(out)["status"] == "cancelled"
    # from stdin, with the name given on the command line
    code, out, err = run(monkeypatch, capsys, svc, "sweep", "submit", "-", "--name", "piped",
                         "--json", stdin=json.dumps(GRID))
    assert code == 0, err
    assert json.loads(out)["name"] == "piped"


def test_bad_sweep_file_names_the_field_and_stores_nothing(svc, monkeypatch, capsys, tmp_path):
    before = svc.http.get("/api/sweeps").json()["items"]
    f = tmp_path / "bad.json"
    f.write_text(json.dumps({**GRID, "grid": {"parallel.dp": []}}))
    code, out, err = run(monkeypatch, capsys, svc, "sweep", "submit", str(f))
    assert code == 2 and out == ""
    assert "grid.parallel.dp" in err and "non-empty" in err, err
    assert svc.http.get("/api/sweeps").json()["items"] == before
