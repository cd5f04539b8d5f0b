"""Group-consistent checkpoints with torch.distributed.checkpoint (DCP), resume and restart.

Format `torch-dcp-v1` (docs/checkpoints.md): torch's standard state dict of the plain model, what
`torch.distributed.checkpoint.state_dict.get_state_dict(model, optimizer)` returns for the
unsharded model built by jobs.models, every tensor whole, fp32:

    {"model": {fqn: parameter},                       (the fp32 master where there is one)
     "optim": {"state": {fqn: {"exp_avg", "exp_avg_sq", "step"}},   Adam (SGD keeps none)
               "param_groups": [{...hyperparameters, "params": [fqn, ...]}]},
     "rng": {"cpu": {"rank{R}": t}, "cuda": {...}}}   each rank's RNG state (same world size)

DCP flattens it to the keys `model.{fqn}`, `optim.state.{fqn}.exp_avg`, ... so a plain
`dcp.load({"model": model.state_dict()}, checkpoint_id=dir)` in one process loads it. Each rank
puts in the tensors it holds (jobs/ckpt_state.py joins dp shards, this module joins reference tp
shards over mesh["tp"]; pipeline stages hold disjoint names); DCP writes each distinct tensor
once (its de-duplication of replicated tensors). A load asks for the same keys at this rank's
shapes and each rank keeps its own shard, which is how a checkpoint of one layout loads into
another. Checkpoints of the previous format `paralab-logical-v1` (flat keys `model/{fqn}`,
`optim/{fqn}/exp_avg`, `optim/step`, `rng/cpu/rank{R}`) load too: the keys are mapped on read.
The data order needs no state: batches are a function of the step.

`step-{k}/COMMITTED` is written by rank 0 after DCP's save returned on every rank and a
barrier; it lists the files and sizes (jobs/ckpt_index.py checks them)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
import torch.distributed as dist

from jobs.ckpt_index import (
    FORMAT,
    LEGACY_FORMAT,
    MARKER,
    MODEL_KEYS,
    read_commit,
    resume_problem,
    step_dir,
)
from jobs.ckpt_state import dp_load, dp_state, supported
from jobs.dumps import global_name
from jobs.models import model_module
from jobs.parallel.optim import make_optimizer
from jobs.testbug import injected


def _dcp():
    """torch.distributed.checkpoint, imported when a checkpoint is saved or loaded: it brings
    DTensor (~0.7 CPU-s per rank) that a run without checkpoints never needs."""
    import torch.distributed.checkpoint as dcp

    return dcp

CRASH_ENV = "PARALAB_TEST_CRASH_AT_STEP"   # TEST-ONLY, read here only: see test_crash()
CRASH_RANK_ENV = "PARALAB_TEST_CRASH_RANK"
CRASH_SAVE_ENV = "PARALAB_TEST_CRASH_BEFORE_COMMIT"


def attempt_number() -> int:
    """0 on torchrun's first attempt, n after its n-th restart."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)


ATTEMPT_FILES = ("trace-rank{r}.jsonl", "error-rank{r}.txt", "flight-rank{r}.json",
                 "stack-rank{r}.txt", "flight/flight_rank_{r}")


def archive_previous_attempt(out: Path, rank: int, attempt: int) -> None:
    """A restarted rank moves its previous attempt's files to OUT/attempts/{attempt-1}/, so
    the files in OUT are always the current attempt's (jobs/ckpt_index.attempts reads both)."""
    if attempt <= 0:
        return
    dest = out / "attempts" / str(attempt - 1)
    dest.mkdir(parents=True, exist_ok=True)
    for pattern in ATTEMPT_FILES:
        f = out / pattern.format(r=rank)
        if f.exists():  # same relative path: torch's fr_trace reads attempts/N/flight/ alone
            (dest / pattern).parent.mkdir(parents=True, exist_ok=True)
            os.replace(f, dest / pattern.format(r=rank))


# --- the logical state of this rank -------------------------------------------------------------

class _Names:
    """Local parameter name -> full-model name and shape, and the tp joins between them."""

    def __init__(self, ctx, comp):
        self.ctx, self.stages = ctx, comp.stages
        spec = ctx.spec
        # build() reseeds the global RNG: forked, so that a save neither records nor leaves
        # behind the post-build state instead of the run's own stream (model.dropout draws it)
        with torch.random.fork_rng(devices=[]):
            full = model_module(spec.model.arch).build(spec.model, spec.train.seed)
        self.shapes = {n: p.shape for n, p in full.named_parameters()}
        self.tp_group = ctx.mesh["tp"].get_group() if ctx.dims.tp > 1 else None

    def name(self, local: str) -> str:
        return global_name(local, self.stages) if self.stages is not None else local

    def _dim(self, gname: str, shape) -> int | None:
        full = self.shapes[gname]
        if tuple(shape) == tuple(full):
            return None
        diff = [i for i, (a, b) in enumerate(zip(shape, full, strict=True)) if a != b]
        assert len(diff) == 1 and shape[diff[0]] * self.ctx.dims.tp == full[diff[0]], \
            (gname, shape, full)
        return diff[0]

    def join(self, gname: str, t: torch.Tensor) -> torch.Tensor:
        """A reference tp shard -> the whole tensor (a collective over tp); else `t`."""
        d = self._dim(gname, t.shape)
        if d is None:
            return t
        parts = [torch.empty_like(t) for _ in range(self.ctx.dims.tp)]
        dist.all_gather(parts, t.contiguous(), group=self.tp_group)
        return torch.cat(parts, d)

    def split(self, gname: str, full: torch.Tensor, shape) -> torch.Tensor:
        d = self._dim(gname, shape)
        if d is None:
            return full
        return full.chunk(self.ctx.dims.tp, d)[self.ctx.dims.coords(self.ctx.rank)["tp"]]


def _logical(ctx, comp, names: _Names):
    """((params, moments, step) by full-model name with tp shards joined, the dp-level state
    it came from). step is None on a rank without an optimizer."""
    params, moments, step = dp_state(comp.strategy, ctx.spec.train.optimizer)
    g_params = {names.name(n): names.join(names.name(n), t) for n, t in params.items()}
    g_moments = {k: {names.name(n): names.join(names.name(n), t) for n, t in by_name.items()}
                 for k, by_name in moments.items()}
    return (g_params, g_moments, step), (params, moments, step)


def _param_groups(ctx, names: _Names) -> list[dict]:
    """torch's param_groups of the plain model's optimizer: the run's hyperparameters (those
    make_optimizer gives) and every parameter's name, in the plain model's order (the same on
    every rank: DCP keeps one copy of a non-tensor value)."""
    t = ctx.spec.train
    probe = make_optimizer([torch.nn.Parameter(torch.zeros(1))], t.optimizer, t.lr)
    hyper = {k: v for k, v in probe.param_groups[0].items() if k != "params"}
    return [{**hyper, "params": list(names.shapes)}]


def _standard(params: dict, moments: dict, step: float | None, rng: dict,
              groups: list | None = None) -> dict:
    """The nested state dict of format FORMAT (the module docstring); `groups` None on a load
    (param_groups are torch's record of the hyperparameters, paralab takes them from the spec).
    Adam's step is per parameter in torch's layout: one float32 scalar each, all equal."""
    state: dict = {"model": dict(params)}
    if step is not None:
        per = {}
        for k, by_name in moments.items():
            for n, t in by_name.items():
                per.setdefault(n, {})[k] = t
        for d in per.values():
            d["step"] = torch.tensor(float(step), dtype=torch.float32)
        state["optim"] = {"state": per, **({"param_groups": groups} if groups else {})}
    if rng:
        state["rng"] = {}
        for (dev, rank), t in rng.items():
            state["rng"].setdefault(dev, {})[f"rank{rank}"] = t
    return state


def _legacy(params: dict, moments: dict, step: float | None, rng: dict) -> dict:
    """The flat keys of LEGACY_FORMAT (paralab-logical-v1) for the same tensors."""
    state = {f"model/{n}": t for n, t in params.items()}
    for k, by_name in moments.items():
        state.update({f"optim/{n}/{k}": t for n, t in by_name.items()})
    if step is not None:
        state["optim/step"] = torch.tensor(float(step), dtype=torch.float32)
    state.update({f"rng/{dev}/rank{rank}": t for (dev, rank), t in rng.items()})
    return state


def _loaded_step(state: dict, legacy: bool) -> float:
    if legacy:
        return float(state["optim/step"])
    per = state.get("optim", {}).get("state", {})
    return float(next(iter(per.values()))["step"]) if per else 0.0


def _rng(ctx) -> dict:
    out = {("cpu", ctx.rank): torch.get_rng_state()}
    if ctx.device.type == "cuda":
        out[("cuda", ctx.rank)] = torch.cuda.get_rng_state(ctx.device)
    return out


def check_supported(comp) -> None:
    """Raise ValueError before training when this run's strategy cannot be checkpointed."""
    supported(comp.strategy)


# --- save ---------------------------------------------------------------------------------------

def save(ctx, comp, steps_done: int) -> Path:
    """A collective: every rank's tensors to step-{steps_done}/, then the commit marker."""
    path = step_dir(ctx.out, steps_done)
    if ctx.rank == 0 and path.exists():  # a partial save of an earlier attempt
        shutil.rmtree(path)
    dist.barrier()
    names = _Names(ctx, comp)
    (params, moments, step), _ = _logical(ctx, comp, names)
    groups = _param_groups(ctx, names) if step is not None else None
    _dcp().save(_standard(params, moments, step, _rng(ctx), groups), checkpoint_id=str(path))
    test_crash_before_commit(ctx, steps_done)
    dist.barrier()  # DCP returned on every rank: every shard and .metadata are on disk
    if ctx.rank == 0:
        files = {f.name: f.stat().st_size for f in sorted(path.iterdir()) if f.is_file()
                 and f.name != MARKER}
        tmp = path / (MARKER + ".tmp")
        tmp.write_text(json.dumps(commit_record(ctx, comp, steps_done, files), indent=1))
        os.replace(tmp, path / MARKER)  # atomic: a marker is whole or absent
    dist.barrier()
    return path


def commit_record(ctx, comp, steps_done: int, files: dict) -> dict:
    spec, d = ctx.spec, ctx.dims
    m = spec.model
    return {"format": FORMAT, "step": steps_done, "world_size": ctx.world,
            "strategy": spec.strategy, "dp": d.dp, "tp": d.tp, "pp": d.pp,
            "zero_stage": spec.parallel.zero_stage, "engine": spec.parallel.engine,
            "arch": m.arch, "model": {k: getattr(m, k) for k in MODEL_KEYS},
            "optimizer": spec.train.optimizer, "precision": spec.train.precision,
            "seed": spec.train.seed, "global_batch": spec.train.global_batch,
            "attempt": attempt_number(), "files": files}


def after_step(ctx, comp, step: int) -> None:
    """Called by the loop after step `step` (0-based) ended: test-only crash, then a checkpoint
    every train.checkpoint_every steps (not after the last step: the run is done)."""
    test_crash(ctx, step)
    every, done = ctx.spec.train.checkpoint_every, step + 1
    if every and done % every == 0 and done < ctx.spec.train.steps:
        save(ctx, comp, done)


# --- load ---------------------------------------------------------------------------------------

def load(ctx, comp, path: Path) -> int:
    """Load a complete checkpoint into this run's strategy; returns the step to start at.
    Raises ValueError when it is partial or cannot be loaded into this spec."""
    commit = read_commit(path)
    if commit is None:
        raise ValueError(f"{path} is not a complete checkpoint (no {MARKER} marker, or a file "
                         "it lists is missing): it is never loaded")
    why = resume_problem(commit, ctx.spec.to_dict())
    if why:
        raise ValueError(f"cannot resume from {path}: {why}")
    names = _Names(ctx, comp)
    (g_params, g_moments, _), (params, moments, step) = _logical(ctx, comp, names)
    same_world = commit["world_size"] == ctx.world
    # RNG streams belong to ranks: restored only where the ranks are the same
    rng = {k: v.clone() for k, v in _rng(ctx).items()} if same_world else {}
    legacy = commit["format"] == LEGACY_FORMAT  # old keys, loaded into the same tensors
    state = (_legacy if legacy else _standard)(g_params, g_moments, step, rng)
    _dcp().load(state, checkpoint_id=str(path))  # fills the tensors of g_params, ... in place
    new_p = {n: names.split(names.name(n), g_params[names.name(n)], t.shape)
             for n, t in params.items()}
    new_m = {k: {n: names.split(names.name(n), g_moments[k][names.name(n)], t.shape)
                 for n, t in by_name.items()} for k, by_name in moments.items()}
    if injected("ckpt_drop_optimizer"):  # test-only bug (jobs/testbug.py)
        new_m = {}
    dp_load(comp.strategy, new_p, new_m, _loaded_step(state, legacy) if step is not None else 0.0)
    for (dev, _), t in rng.items():
        if dev == "cpu":
            torch.set_rng_state(t)
        else:
            torch.cuda.set_rng_state(t, ctx.device)
    dist.barrier()
    return int(commit["step"])


# --- TEST-ONLY crash injection (never set by the service) ---------------------------------------
# PARALAB_TEST_CRASH_AT_STEP=k: on torchrun's attempt 0, rank PARALAB_TEST_CRASH_RANK (default
# 1) raises after step k (0-based) ended, before that step's checkpoint. Used by tests/ckpt to
# exercise automatic restart until the faults feature (jobs/faults.py, kind "crash") replaces it.
# PARALAB_TEST_CRASH_BEFORE_COMMIT=k: on attempt 0 that rank exits hard after DCP wrote the
# checkpoint of k steps, before the barrier and the commit marker (a partial checkpoint).

def _crash_rank() -> int:
    return int(os.environ.get(CRASH_RANK_ENV, "1"))


def test_crash(ctx, step: int) -> None:
    v = os.environ.get(CRASH_ENV)
    if v is not None and int(v) == step and attempt_number() == 0 and ctx.rank == _crash_rank():
        raise RuntimeError(f"test crash ({CRASH_ENV}={v}) on rank {ctx.rank}, attempt 0")


def test_crash_before_commit(ctx, steps_done: int) -> None:
    v = os.environ.get(CRASH_SAVE_ENV)
    if v is not None and int(v) == steps_done and attempt_number() == 0 and \
            ctx.rank == _crash_rank():
        (ctx.out / f"error-rank{ctx.rank}.txt").write_text(
            f"rank {ctx.rank}: SystemExit: test kill while saving step {steps_done} "
            f"({CRASH_SAVE_ENV})\n")
        os._exit(17)
