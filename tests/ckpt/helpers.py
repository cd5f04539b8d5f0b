"""What the checkpoint tests share: the runs of one launch and how they are read."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from tests.support.launch import _raise, torchrun

TOL = 1e-6  # fp32: interrupted-and-resumed vs uninterrupted loss, per step
STEPS, AT = 6, 3  # the uninterrupted run's steps; the interrupted run's checkpoint step
GPT = {"arch": "gpt", "hidden": 32, "layers": 2, "seq_len": 8, "vocab": 64}
BUG = {"PARALAB_TEST_BUG": "ckpt_drop_optimizer"}  # jobs/testbug.py


def spec_of(preset: str | None = None, **over) -> dict:
    spec = {"preset": preset} if preset else {}
    if preset in ("tp", "3d"):
        spec["model"] = dict(GPT)
    for k, v in over.items():
        spec[k] = {**spec.get(k, {}), **v}
    spec.setdefault("train", {})["steps"] = STEPS
    return spec


def trio(name: str, spec: dict, resumed: dict | None = None) -> list[list]:
    """[full run, interrupted run (AT + 1 steps, checkpoint after AT), run resumed from it];
    `resumed` is the resumed run's spec when it differs (another layout)."""
    short = copy.deepcopy(spec)
    short["train"] = {**short["train"], "steps": AT + 1, "checkpoint_every": AT}
    ck = f"{name}-short/checkpoints/step-{AT:06d}"
    return [[f"{name}-full", spec, None, {}], [f"{name}-short", short, None, {}],
            [f"{name}-resumed", resumed or spec, ck, {}]]


def launch(nproc: int, runs: list[list], out: Path, timeout: float = 600) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "specs.json").write_text(json.dumps(runs))
    proc = torchrun(nproc, ["-m", "tests.ckpt.multirun_resume", "--specs",
                            str(out / "specs.json"), "--out", str(out)], timeout=timeout)
    if proc.returncode != 0:
        _raise(proc, out)
    return out


def summary(out: Path, name: str) -> dict:
    f = out / name / "summary.json"
    if not f.exists():
        errs = [e.read_text()[-1500:] for e in sorted((out / name).glob("error-rank*.txt"))]
        raise AssertionError(f"{name}: no summary; errors: {errs[:1]}")
    return json.loads(f.read_text())


def loss_gap(full: list[float], resumed: list[float], start: int, rel: bool = False) -> float:
    """The largest per-step difference between the resumed run and the same steps of the
    uninterrupted run (relative to the loss when `rel`)."""
    tail = full[start:]
    assert len(tail) == len(resumed), (len(tail), len(resumed))
    gaps = [abs(a - b) / (abs(a) if rel else 1.0) for a, b in zip(tail, resumed, strict=True)]
    return float("inf") if any(g != g for g in gaps) else max(gaps)  # a NaN is no match
