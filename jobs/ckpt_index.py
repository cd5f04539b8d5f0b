"""What a run's output folder says about its checkpoints and torchrun attempts, read without
torch (the backend and the worker import this module: the standard library and jobs/spec.py,
itself standard library only).

    OUT/checkpoints/step-{k:06d}/          k = steps completed when it was saved
        __{r}_0.distcp, .metadata           torch.distributed.checkpoint's files
        COMMITTED                           JSON, written by rank 0 last (docs/checkpoints.md)
    OUT/attempts/{n}/                       attempt n's traces / errors, moved there by the
                                            ranks of attempt n+1 when torchrun restarted the job

A step folder counts only with its COMMITTED marker and every file the marker lists, at the
size it lists: anything else is a partial checkpoint (a rank died while saving) and is never
listed, so it is never offered for resume.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

from jobs.spec import parse_spec

# torch's standard state dict of the plain model, {"model", "optim", "rng"} (jobs/ckpt.py)
FORMAT = "torch-dcp-v1"
LEGACY_FORMAT = "paralab-logical-v1"  # flat keys model/{name}, ...: still loaded, keys mapped
FORMATS = (FORMAT, LEGACY_FORMAT)
MARKER = "COMMITTED"
STEP_DIR = re.compile(r"step-(\d{6,})$")
# model settings that fix the parameters' names and shapes (timed-layer delays do not)
MODEL_KEYS = ("arch", "layers", "hidden", "heads", "seq_len", "vocab")


def step_dir(out_dir: str | Path, step: int) -> Path:
    """The one place the folder name of a checkpoint is spelt."""
    return Path(out_dir) / "checkpoints" / f"step-{step:06d}"


def read_commit(path: str | Path) -> dict | None:
    """The COMMITTED contents of one step folder plus `path`, or None when the checkpoint is
    partial: no marker, an unreadable marker, or a listed file missing or of another size."""
    path = Path(path)
    try:
        commit = json.loads((path / MARKER).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(commit, dict) or not isinstance(commit.get("files"), dict):
        return None
    for name, size in commit["files"].items():
        f = path / name
        if "/" in name or not f.is_file() or f.stat().st_size != size:
            return None
    return {**commit, "path": str(path)}


def complete_checkpoints(out_dir: str | Path) -> list[dict]:
    """Every complete checkpoint of a run folder (COMMITTED contents + `path`), by step."""
    root = Path(out_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = []
    for d in root.iterdir():
        m = STEP_DIR.match(d.name)
        if m and d.is_dir():
            c = read_commit(d)
            if c is not None and c.get("step") == int(m.group(1)):
                found.append(c)
    return sorted(found, key=lambda c: c["step"])


def latest_checkpoint(out_dir: str | Path) -> dict | None:
    done = complete_checkpoints(out_dir)
    return done[-1] if done else None


def resume_problem(commit: dict, spec_dict: dict) -> str | None:
    """Why the checkpoint `commit` (COMMITTED contents) cannot be loaded into a run of
    `spec_dict` (a train spec as a dict), or None when it can. The format stores every tensor
    whole under its model-wide name, so any dp / tp / pp / ZeRO / engine layout of the same
    model and optimizer can load it, except the layouts listed in docs/checkpoints.md."""
    if commit.get("format") not in FORMATS:
        return f"checkpoint format {commit.get('format')!r} is not one of {FORMATS!r}"
    try:  # presets resolved, defaults filled in: the spec as the run will see it
        spec = parse_spec(copy.deepcopy(spec_dict), max_world_size=1 << 30).to_dict()
    except ValueError as exc:
        return f"the spec is invalid: {exc}"
    for k in MODEL_KEYS:
        have, want = commit.get("model", {}).get(k), spec["model"][k]
        if have != want:
            return (f"model.{k} differs: the checkpoint has {have!r}, this run {want!r} "
                    "(parameters of another shape cannot be loaded)")
    opt = spec["train"]["optimizer"]
    if commit.get("optimizer") != opt:
        return (f"train.optimizer differs: the checkpoint holds {commit.get('optimizer')!r} "
                f"state, this run uses {opt!r}")
    steps = spec["train"]["steps"]
    if commit.get("step", 0) >= steps:
        return (f"the checkpoint is at step {commit.get('step')}, this run has train.steps = "
                f"{steps}: nothing is left to train")
    p = spec["parallel"]
    if p["engine"] == "native" and p["zero_stage"] == 1 and p["dp"] > 1 and \
            p["tp"] == 1 and p["pp"] == 1:
        return ("native ZeRO-1 (ZeroRedundancyOptimizer) keeps each parameter's optimizer state "
                "on one owner rank only; loading a checkpoint into it is not supported")
    return None


def _first_error_line(path: Path) -> str:
    try:
        for line in path.read_text(errors="replace").splitlines():
            if line.strip():
                return line.strip()
    except OSError:
        pass
    return ""


# what a rank says when another rank died under it (gloo, NCCL): a consequence, not a cause
PEER_FAILED = ("closed by peer", "reset by peer", "remote worker", "NCCL communicator was aborted")


def _rank_of(path: Path) -> int:
    return int(re.sub(r"\D", "", path.stem) or 0)


def _attempt_of(folder: Path) -> dict:
    """Steps and failures of one attempt's files (the traces' step spans and `after_step`
    memory samples, the ranks' error files)."""
    started, done_by_rank, number = [], [], None
    for f in sorted(folder.glob("trace-rank*.jsonl")):
        try:
            lines = f.read_text(errors="replace").splitlines()
        except OSError:
            continue
        done = -1
        for line in lines:
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # a line cut short by a crash
            kind, step = rec.get("type"), rec.get("step")
            if kind == "meta" and number is None:
                number = rec.get("attempt")
            elif not isinstance(step, int) or step < 0:
                continue
            elif kind == "span" and rec.get("name") == "step":
                started.append(step)
            elif kind == "mem" and rec.get("phase") == "after_step":
                done = max(done, step)  # the optimizer update of `step` ran on this rank
        done_by_rank.append(done)
    failed = []
    for f in folder.glob("error-rank*.txt"):
        line = _first_error_line(f)
        failed.append({"rank": _rank_of(f), "error": line, "_key": (
            f.stat().st_mtime_ns, any(m in line for m in PEER_FAILED), _rank_of(f))})
    # the first error written is the likeliest cause, the rest followed it; file times are
    # coarse (a clock tick), so at a tie an error that reports a lost peer comes later
    failed.sort(key=lambda e: e.pop("_key"))
    last = min(done_by_rank) if done_by_rank else -1
    cause = None
    if failed:
        e = failed[0]
        cause = e["error"] if e["error"].startswith(f"rank {e['rank']}:") else \
            f"rank {e['rank']}: {e['error']}"
    return {"attempt": number, "first_step": min(started) if started else None,
            "last_step": last if last >= 0 else None, "failed_ranks": failed, "cause": cause}


def attempts(out_dir: str | Path) -> list[dict]:
    """One entry per torchrun attempt, oldest first: {attempt, first_step (the first step it
    began), last_step (the last step every rank completed, its optimizer update included; None
    if none), failed_ranks: [{rank, error}] in the order the errors were written, cause (the
    first of them: "rank R: Type: message"; None for an attempt that did not fail)}. Earlier
    attempts lie in OUT/attempts/{n}/, the last in OUT itself; a run never restarted has one."""
    out_dir = Path(out_dir)
    found = []
    root = out_dir / "attempts"
    if root.is_dir():
        for d in root.iterdir():
            if d.is_dir() and d.name.isdigit():
                found.append((int(d.name), _attempt_of(d)))
    found.sort(key=lambda x: x[0])
    rows = []
    for n, row in found:
        rows.append({**row, "attempt": n})
    if any(out_dir.glob("trace-rank*.jsonl")) or any(out_dir.glob("error-rank*.txt")):
        last = _attempt_of(out_dir)
        rows.append({**last, "attempt": last["attempt"] if last["attempt"] is not None
                     else (found[-1][0] + 1 if found else 0)})
    return rows
