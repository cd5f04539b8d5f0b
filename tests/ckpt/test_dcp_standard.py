"""Checkpoints are torch's standard state dict of the plain model: a ZeRO-3 (dp = 4) run and a
tp = 2 x pp = 2 run save one each, and a fresh single process with no process group loads it
with torch's API only (tests/ckpt/plain_load.py): `dcp.load({"model": model.state_dict()})`
gives the loss the run had at the checkpoint's step (1e-6), torch's get_state_dict /
set_state_dict pattern loads the optimizer state too, and one torch Adam step from it gives
the loss paralab's own resume (a run resumed from the same checkpoint) had at the next step.
The checkpoint's keys, shapes and dtypes are those torch saves for the plain model +
torch.optim.Adam (its own get_state_dict, saved by DCP), plus paralab's `rng`. A checkpoint in
the previous format (paralab-logical-v1, written here from the new one by key mapping) still
resumes, to the same losses. And torch alone reshards it: FSDP2 over 2 ranks loads it with
get_state_dict / dcp.load / set_state_dict and continues like paralab's resume. One launch of
4 ranks, then one of 2 ranks per layout for FSDP2 and one of 4 for the old-format resume."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from jobs.ckpt_index import FORMAT, LEGACY_FORMAT, MARKER, read_commit, step_dir
from tests.ckpt.helpers import AT, GPT, TOL, launch, summary
from tests.support.launch import ROOT, torchrun

W4 = {"nproc_per_node": 4}
LAYOUTS = {"z3": {"dp": 4, "zero_stage": 3}, "tp2-pp2": {"tp": 2, "pp": 2, "microbatches": 2}}


def _spec(parallel: dict, steps: int, every: int = 0) -> dict:
    return {"model": GPT, "parallel": parallel, "runtime": W4,
            "train": {"steps": steps, "checkpoint_every": every}}


def _ck(name: str) -> str:
    return f"{name}-short/checkpoints/step-{AT:06d}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Per layout: `-short` saves after step AT and runs step AT; `-resumed` resumes from that
    checkpoint for steps AT and AT + 1."""
    specs = []
    for name, p in LAYOUTS.items():
        specs += [[f"{name}-short", _spec(p, AT + 1, AT), None, {}],
                  [f"{name}-resumed", _spec(p, AT + 2), _ck(name), {}]]
    return launch(4, specs, tmp_path_factory.mktemp("dcpstd"))


def _plain(runs, name: str) -> dict:
    """tests/ckpt/plain_load.py on the checkpoint of layout `name`, in a fresh process."""
    spec = runs / f"{name}-spec.json"
    spec.write_text(json.dumps(_spec(LAYOUTS[name], AT + 2)))
    out = runs / f"{name}-plain.json"
    proc = subprocess.run([sys.executable, "-m", "tests.ckpt.plain_load", "--ckpt",
                           str(runs / _ck(name)), "--spec", str(spec), "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def plain(runs):
    """_plain of a layout, run once per layout (a failure stays with its layout)."""
    done = {}

    def get(name: str) -> dict:
        if name not in done:
            done[name] = _plain(runs, name)
        return done[name]
    return get


def _close(a: list[float], b: list[float]) -> bool:
    """Every pair within TOL (a NaN fails: it is not within anything)."""
    return len(a) == len(b) and all(abs(x - y) <= TOL for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("name", LAYOUTS)
def test_plain_torch_loads_the_checkpoint(runs, plain, name):
    assert read_commit(runs / _ck(name))["format"] == FORMAT
    got = plain(name)
    short, resumed = summary(runs, f"{name}-short"), summary(runs, f"{name}-resumed")
    assert got["step"] == AT and resumed["start_step"] == AT
    # the weights alone: the run's loss at the step after the checkpoint
    assert _close([got["loss_model_only"]], [short["loss"][AT]]), (got, short["loss"])
    # weights + optimizer through get_state_dict / set_state_dict, one torch Adam step: the
    # losses paralab's own resume had (the second depends on the optimizer state restored)
    assert _close(resumed["loss"], got["losses"]), (resumed["loss"], got["losses"])
    assert got["param_groups_equal"]


@pytest.mark.parametrize("name", LAYOUTS)
def test_layout_is_torchs(plain, name):
    got = plain(name)
    ours = [k for k in got["keys"] if not k.startswith("rng.")]
    assert ours == got["torch_keys"]
    assert "model.embed.tok.weight" in ours and "optim.state.embed.tok.weight.exp_avg" in ours
    theirs = got["torch_shapes"]
    assert {k: v for k, v in got["shapes"].items() if k in theirs} == theirs
    assert {k for k in got["keys"] if k.startswith("rng.")} == {f"rng.cpu.rank{r}"
                                                               for r in range(4)}


@pytest.mark.parametrize("name", LAYOUTS)
def test_fsdp2_loads_it_resharded(runs, name):
    """Into another layout with torch's API only (tests/ckpt/fsdp_load.py: FSDP2 over 2 ranks,
    the snippet of docs/checkpoints.md): the losses paralab's own resume had."""
    spec = runs / f"{name}-spec1.json"
    spec.write_text(json.dumps({**_spec({}, AT + 2), "runtime": {"nproc_per_node": 1}}))
    out = runs / f"{name}-fsdp.json"
    proc = torchrun(2, ["-m", "tests.ckpt.fsdp_load", "--ckpt", str(runs / _ck(name)),
                        "--spec", str(spec), "--out", str(out)], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got, resumed = json.loads(out.read_text())["losses"], summary(runs, f"{name}-resumed")
    assert _close(resumed["loss"], got), (resumed["loss"], got)


def _to_legacy(src, dst) -> None:
    """The checkpoint `src` rewritten as the previous format wrote it: flat keys model/{fqn},
    optim/{fqn}/exp_avg|exp_avg_sq, optim/step, rng/cpu/rank{R}; marker format
    paralab-logical-v1 (single process, plain DCP)."""
    dst.mkdir(parents=True)
    whole = dst.parent / "whole.pt"
    dcp_to_torch_save(str(src), str(whole))
    sd = torch.load(whole, weights_only=False)
    flat = {f"model/{n}": t for n, t in sd["model"].items()}
    steps = set()
    for n, st in sd["optim"]["state"].items():
        flat.update({f"optim/{n}/{k}": t for k, t in st.items() if k != "step"})
        steps.add(float(st["step"]))
    assert steps == {float(AT)}
    flat["optim/step"] = torch.tensor(float(AT))
    flat.update({f"rng/{dev}/{r}": t for dev, by in sd["rng"].items() for r, t in by.items()})
    dcp.save(flat, checkpoint_id=str(dst))
    commit = {k: v for k, v in read_commit(src).items() if k != "path"}
    commit["format"] = LEGACY_FORMAT
    commit["files"] = {f.name: f.stat().st_size for f in sorted(dst.iterdir()) if f.is_file()}
    (dst / MARKER).write_text(json.dumps(commit))


def test_previous_format_resumes(runs, tmp_path):
    old = step_dir(tmp_path / "z3-old", AT)
    _to_legacy(runs / _ck("z3"), old)
    meta = dcp.FileSystemReader(str(old)).read_metadata().state_dict_metadata
    assert "model/embed.tok.weight" in meta and "optim/step" in meta
    out = launch(4, [["z3-from-old", _spec(LAYOUTS["z3"], AT + 2), str(old), {}]],
                 tmp_path / "launch")
    new, res = summary(runs, "z3-resumed"), summary(out, "z3-from-old")
    assert res["start_step"] == AT
    assert _close(new["loss"], res["loss"]), (new["loss"], res["loss"])


def test_the_checkpoint_and_flight_downloads_are_what_torch_reads(runs, client, settings,
                                                                  tmp_path):
    """GET /export?format=checkpoint|flight (and `paralab export`'s route): the stored files
    byte for byte in a zip; the unzipped checkpoint loads with plain DCP into the plain model
    (tests/ckpt/plain_load.py: the run's loss), torch's fr_trace reads the unzipped dumps."""
    import io
    import shutil
    import zipfile

    from backend import crud
    from backend.core.db import get_sessionmaker
    from jobs.spec import parse_spec
    with get_sessionmaker(settings.db_url)() as db:
        rid = crud.create_run(db, parse_spec(_spec(LAYOUTS["z3"], AT + 1, AT)), owner="local",
                              tags=[], notes="").id
    shutil.copytree(runs / "z3-short", settings.runs_dir / rid)
    ck = client.get(f"/api/runs/{rid}/export", params={"format": "checkpoint"})
    assert ck.status_code == 200, ck.text
    with zipfile.ZipFile(io.BytesIO(ck.content)) as z:
        z.extractall(tmp_path / "ck")
        names = z.namelist()
    folder = f"step-{AT:06d}"
    src = runs / _ck("z3")
    assert sorted(names) == sorted(f"{folder}/{f.name}" for f in src.iterdir())
    for f in src.iterdir():
        assert (tmp_path / "ck" / folder / f.name).read_bytes() == f.read_bytes()
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(_spec(LAYOUTS["z3"], AT + 2)))
    proc = subprocess.run([sys.executable, "-m", "tests.ckpt.plain_load", "--ckpt",
                           str(tmp_path / "ck" / folder), "--spec", str(spec), "--out",
                           str(tmp_path / "plain.json")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads((tmp_path / "plain.json").read_text())
    assert _close([got["loss_model_only"]], [summary(runs, "z3-short")["loss"][AT]])
    bad = client.get(f"/api/runs/{rid}/export", params={"format": "checkpoint", "step": 99})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["query", "step"]

    fl = client.get(f"/api/runs/{rid}/export", params={"format": "flight"})
    assert fl.status_code == 200, fl.text
    with zipfile.ZipFile(io.BytesIO(fl.content)) as z:
        z.extractall(tmp_path / "fl")
    dumps = sorted((runs / "z3-short" / "flight").iterdir())
    assert [p.name for p in sorted((tmp_path / "fl" / "flight").iterdir())] == \
        [p.name for p in dumps] == [f"flight_rank_{r}" for r in range(4)]
    fr = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace",
                         str(tmp_path / "fl" / "flight"), "--prefix", "flight_rank_"],
                        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert fr.returncode == 0, fr.stderr[-3000:]
