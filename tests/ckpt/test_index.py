"""jobs/ckpt_index.py on folders built by hand: a partial checkpoint (no COMMITTED marker, a
shard missing or cut short, a marker cut short) is never listed and never loaded; what
resume_problem refuses; attempts(); and the module stays torch-free."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from jobs import ckpt
from jobs.ckpt_index import (
    FORMAT,
    LEGACY_FORMAT,
    MODEL_KEYS,
    attempts,
    complete_checkpoints,
    resume_problem,
    step_dir,
)
from jobs.spec import ModelSpec, parse_spec
from tests.support.launch import ROOT

MODEL = {k: getattr(ModelSpec(), k) for k in MODEL_KEYS}


def _ckpt(out, step: int, *, commit: bool = True, world: int = 2) -> dict:
    d = step_dir(out, step)
    d.mkdir(parents=True)
    files = {".metadata": b"m" * 10, **{f"__{r}_0.distcp": b"x" * (100 + r)
                                         for r in range(world)}}
    for name, data in files.items():
        (d / name).write_bytes(data)
    c = {"format": FORMAT, "step": step, "world_size": world, "model": MODEL,
         "optimizer": "adam", "files": {n: len(b) for n, b in files.items()}}
    if commit:
        (d / "COMMITTED").write_text(json.dumps(c))
    return c


def test_only_committed_whole_checkpoints_are_listed(tmp_path):
    _ckpt(tmp_path, 2)
    _ckpt(tmp_path, 10)
    _ckpt(tmp_path, 4, commit=False)          # a rank died before the marker
    _ckpt(tmp_path, 6)
    (step_dir(tmp_path, 6) / "__1_0.distcp").unlink()  # a shard missing
    _ckpt(tmp_path, 8)
    (step_dir(tmp_path, 8) / "__0_0.distcp").write_bytes(b"x")  # a shard cut short
    _ckpt(tmp_path, 12)
    (step_dir(tmp_path, 12) / "COMMITTED").write_text('{"format": ')  # a marker cut short
    done = complete_checkpoints(tmp_path)
    assert [c["step"] for c in done] == [2, 10]
    assert done[0]["path"] == str(step_dir(tmp_path, 2)) and done[0]["world_size"] == 2
    assert complete_checkpoints(tmp_path / "nothing") == []


@pytest.mark.parametrize("step", [4, 6, 8])
def test_partial_checkpoint_is_not_loadable(tmp_path, step):
    _ckpt(tmp_path, 6)
    (step_dir(tmp_path, 6) / "__1_0.distcp").unlink()
    _ckpt(tmp_path, 8)
    (step_dir(tmp_path, 8) / "__0_0.distcp").write_bytes(b"x")
    if step == 4:
        _ckpt(tmp_path, 4, commit=False)
    with pytest.raises(ValueError, match="not a complete checkpoint"):
        ckpt.load(None, None, step_dir(tmp_path, step))  # refused before any collective


def _spec(**over) -> dict:
    s = parse_spec({"preset": "ddp", **over}).to_dict()
    s["train"]["steps"] = 20
    return s


def test_resume_problem():
    c = {"format": FORMAT, "step": 5, "model": MODEL, "optimizer": "adam", "world_size": 2}
    assert resume_problem(c, _spec()) is None
    assert resume_problem(c, {"train": {"steps": 20}, "runtime": {"nproc_per_node": 1}}) is None
    assert "model.arch differs" in resume_problem(c, {"preset": "tp"})  # presets resolved
    assert "invalid" in resume_problem(c, {"train": {"steps": -1}})
    # any layout of the same model
    assert resume_problem(c, _spec(parallel={"dp": 2, "zero_stage": 3})) is None
    assert "model.hidden differs" in resume_problem(c, _spec(model={"hidden": 32}))
    assert "model.arch differs" in resume_problem(c, _spec(model={"arch": "gpt"}))
    assert "model.layers differs" in resume_problem(c, _spec(model={"layers": 2}))
    assert "train.optimizer differs" in resume_problem(c, _spec(train={"optimizer": "sgd"}))
    short = _spec()
    short["train"]["steps"] = 5
    assert "nothing is left" in resume_problem(c, short)
    z1 = _spec(parallel={"dp": 2, "zero_stage": 1, "engine": "native"})
    assert "ZeroRedundancyOptimizer" in resume_problem(c, z1)
    assert "format" in resume_problem({**c, "format": "other"}, _spec())
    assert resume_problem({**c, "format": LEGACY_FORMAT}, _spec()) is None  # keys mapped on read


def _trace(path, attempt: int, steps: range, done: range, *, rank: int) -> None:
    recs = [{"type": "meta", "attempt": attempt, "rank": rank}]
    for s in steps:
        recs.append({"type": "span", "name": "step", "step": s})
        if s in done:
            recs.append({"type": "mem", "phase": "after_step", "step": s})
    path.write_text("\n".join(json.dumps(r) for r in recs) + "\n{\"type\": \"sp")  # cut line


def test_attempts(tmp_path):
    a0 = tmp_path / "attempts" / "0"
    a0.mkdir(parents=True)
    _trace(a0 / "trace-rank0.jsonl", 0, range(0, 5), range(0, 4), rank=0)
    _trace(a0 / "trace-rank1.jsonl", 0, range(0, 4), range(0, 4), rank=1)
    (a0 / "error-rank1.txt").write_text("rank 1: RuntimeError: boom\n\ntraceback...")
    (a0 / "error-rank0.txt").write_text("rank 0: RuntimeError: Connection closed by peer\n")
    for r in (0, 1):  # the same file time (a coarse clock): the lost-peer error comes second
        os.utime(a0 / f"error-rank{r}.txt", ns=(10**18, 10**18))
    _trace(tmp_path / "trace-rank0.jsonl", 1, range(2, 6), range(2, 6), rank=0)
    _trace(tmp_path / "trace-rank1.jsonl", 1, range(2, 6), range(2, 6), rank=1)
    rows = attempts(tmp_path)
    assert [r["attempt"] for r in rows] == [0, 1]
    assert rows[0]["cause"] == "rank 1: RuntimeError: boom"  # the first error written
    assert [e["rank"] for e in rows[0]["failed_ranks"]] == [1, 0]
    assert (rows[0]["first_step"], rows[0]["last_step"]) == (0, 3)
    assert rows[1] == {"attempt": 1, "first_step": 2, "last_step": 5, "failed_ranks": [],
                       "cause": None}
    assert attempts(tmp_path / "empty") == []
    os.utime(a0 / "error-rank0.txt", ns=(10**18 - 10**9, 10**18 - 10**9))  # written first
    assert attempts(tmp_path)[0]["cause"].startswith("rank 0:")


def test_index_is_torch_free():
    """A fresh interpreter imports the index (it lists checkpoints: it works) and holds no
    torch module afterwards."""
    code = ("import json, sys, jobs.ckpt_index as ix; "
            "print(json.dumps([ix.__file__, ix.attempts(sys.argv[1]), "
            "sorted(m for m in sys.modules if m.split('.')[0] == 'torch')]))")
    out = subprocess.run([sys.executable, "-c", code, str(ROOT / "no-such-run")], cwd=ROOT,
                         check=True, capture_output=True, text=True,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    path, rows, torch_modules = json.loads(out.stdout)
    assert path == str(ROOT / "jobs" / "ckpt_index.py")  # this tree's module
    assert rows == [] and torch_modules == []
