"""A user's own training script, run on every rank by torchrun under torch.profiler:

    torchrun --nproc-per-node N -m jobs.script_runner --spec SPEC.json --out OUT --workdir DIR

The runner changes into DIR, puts DIR first on sys.path, sets sys.argv to [entry, *args] and
the spec's `script.env`, then runs the entry as `__main__` (runpy.run_path, or run_module for
'-m pkg.module'), unmodified. Around it a torch.profiler (CPU activity, CUDA too when there is
one; shapes and memory recorded) is advanced by torch's global optimizer hook
(`register_optimizer_step_post_hook`), so a script that never calls `prof.step()` still gets one
ProfilerStep#N span per optimizer step: step N is everything up to the end of the (N+1)-th
`optimizer.step()`. Each rank writes OUT/kineto/rank{R}.json (the last window the schedule
completed; `profiler_schedule` says how the spec's `trace` section maps to torch's schedule),
OUT/script-rank{R}.json (optimizer steps taken, the schedule used) and, through
`paralab.log`, OUT/metrics-rank{R}.jsonl; jobs/script_flight.py keeps the flight files the
worker's hang watch reads and dumps stacks on SIGUSR1. A script's exception goes to
OUT/error-rank{R}.txt (jobs/entry.py's report) and is re-raised, so torchrun sees the failure.
After torchrun exits, jobs/script_analysis.py turns the folder into a run like any other.
docs/scripts.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import runpy
import sys
import time
import traceback
import warnings
from pathlib import Path

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from jobs import script_flight
from jobs import trace_schedule as TS
from jobs.spec import JobSpec, parse_spec

_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
METRICS_ENV = "PARALAB_METRICS_FILE"  # paralab.METRICS_ENV (the public package, not imported)


def profiler_schedule(trace) -> dict | None:
    """torch.profiler.schedule(...) arguments for the spec's `trace` section, or None (record
    every step, one window). Approximations: the default schedule keeps only its first
    DEFAULT_FIRST steps (not the later windows); an explicit steps list is traced from its
    first to its last step, the steps between included."""
    m = TS.mode(trace)
    if m == "all":
        return None
    if m == "schedule":
        return {"wait": trace.wait, "warmup": trace.warmup, "active": trace.active,
                "repeat": trace.repeat}
    if m == "steps":
        listed = TS.parse_steps(trace.steps)
        return {"wait": listed[0], "warmup": 0, "active": listed[-1] - listed[0] + 1,
                "repeat": 1}
    return {"wait": 0, "warmup": 0, "active": TS.DEFAULT_FIRST, "repeat": 1}


def _dist_info() -> dict | None:
    """What torch.profiler writes as distributedInfo, taken while the script's process group
    exists (the profiler takes it when a window starts, maybe before the script made one)."""
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()):
        return None
    return {"backend": dist.get_backend(), "rank": dist.get_rank(),
            "world_size": dist.get_world_size(), "pg_count": dist.get_pg_count(),
            "pg_config": dist.distributed_c10d._get_all_pg_configs()}


class _Tracer:
    """The profiler, its optimizer hook and the export of each window to one file per rank."""

    def __init__(self, spec: JobSpec, out: Path, rank: int):
        self.path = out / "kineto" / f"rank{rank}.json"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.rank, self.steps, self.windows, self.info = rank, 0, 0, None
        self.schedule = profiler_schedule(spec.trace)
        warnings.filterwarnings("ignore", "Profiler won't be using warmup")  # warmup 0 is ours
        acts = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        self.prof = torch.profiler.profile(
            activities=acts, record_shapes=True, profile_memory=True,
            schedule=torch.profiler.schedule(**self.schedule) if self.schedule else None,
            on_trace_ready=self._export)
        self.hook = None

    def _on_step(self, optimizer, args, kwargs) -> None:
        self.steps += 1
        if self.info is None:
            self.info = _dist_info()
        self.prof.step()

    def _export(self, prof) -> None:
        """Write the window to a temporary file, add distributedInfo when the profiler had no
        process group to read when the window began, drop the ProfilerStep#N span of the
        tail after the last optimizer step (N >= the steps taken: no step of the script),
        then replace the rank's file (so it always holds the last window, whole)."""
        tmp = self.path.with_name(self.path.name + ".part")
        prof.export_chrome_trace(str(tmp))
        doc = json.loads(tmp.read_text())
        if "distributedInfo" not in doc:
            info = self.info or _dist_info() or {
                "backend": None, "rank": self.rank,
                "world_size": int(os.environ.get("WORLD_SIZE", "1"))}
            # before traceEvents: readers take it from the file's head (jobs/kineto/reader.py)
            doc = {"distributedInfo": info, **doc}
        doc["traceEvents"] = [e for e in doc.get("traceEvents", []) if not (
            (m := _STEP_RE.match(str(e.get("name", "")))) and int(m.group(1)) >= self.steps)]
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, self.path)
        self.windows += 1

    def __enter__(self):
        import torch.distributed as dist
        self.hook = register_optimizer_step_post_hook(self._on_step)
        self.prof.start()
        self._destroy = dist.destroy_process_group
        dist.destroy_process_group = self._destroy_after_stop
        return self

    def _destroy_after_stop(self, *args, **kwargs):
        """The script's destroy_process_group: the profiler stops first. Seen here (gloo,
        torch 2.13): destroying the group while the profiler records can deadlock (the main
        thread joins gloo's worker thread holding the GIL the worker waits for); it also
        lets the export read the group for distributedInfo."""
        self.stop()
        return self._destroy(*args, **kwargs)

    def stop(self) -> None:
        """Remove the hook and stop the profiler (a window still open, because the run ended
        or failed in it, is written); once."""
        if self.hook is None:
            return
        hook, self.hook = self.hook, None
        try:
            hook.remove()
        finally:
            self.prof.stop()

    def __exit__(self, *exc) -> None:
        import torch.distributed as dist
        dist.destroy_process_group = self._destroy
        self.stop()


class LogTee:
    """Rank 0's stdout, passed through unchanged; each complete line that `script.log_regex`
    matches becomes a metrics line as `paralab.log` writes it: the named groups that parse as
    numbers, at the step of the `step` group, else the last optimizer step completed
    (`steps()` - 1, at least 0)."""

    def __init__(self, stream, regex: str, path: Path, steps):
        self.stream, self.rx, self.path, self.steps = stream, re.compile(regex), path, steps
        self.buf = ""

    def write(self, text: str) -> int:
        n = self.stream.write(text)
        self.buf += text
        while "\n" in self.buf:
            line, self.buf = self.buf.split("\n", 1)
            self._scan(line)
        return n

    def flush(self) -> None:
        self.stream.flush()

    def __getattr__(self, name):  # fileno, isatty, encoding, ... of the real stream
        return getattr(self.stream, name)

    def _scan(self, line: str) -> None:
        m = self.rx.search(line)
        if not m:
            return
        groups = {k: v for k, v in m.groupdict().items() if v is not None}
        step = groups.pop("step", None)
        step = int(step) if step is not None and step.isdigit() else max(self.steps() - 1, 0)
        metrics = {}
        for k, v in groups.items():
            try:
                metrics[k] = float(v)
            except ValueError:
                continue
        if metrics:
            with open(self.path, "a") as f:
                f.write(json.dumps({"step": step, "ts_ns": time.time_ns(), "metrics": metrics,
                                    "source": "log_regex"}, separators=(",", ":")) + "\n")


def run_entry(spec: JobSpec, workdir: Path) -> None:
    """Run the script as `__main__` from `workdir`, with its arguments and environment."""
    sc = spec.script
    os.chdir(workdir)
    sys.path[0] = str(workdir)
    os.environ.update(sc.env)
    if sc.entry.startswith("-m "):
        sys.argv = [sc.entry[3:], *sc.args]
        runpy.run_module(sc.entry[3:], run_name="__main__", alter_sys=True)
    else:
        path = workdir / sc.entry
        sys.argv = [str(path), *sc.args]
        runpy.run_path(str(path), run_name="__main__")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="jobs.script_runner")
    ap.add_argument("--spec", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--workdir", required=True, type=Path)
    args = ap.parse_args(argv)
    out, workdir = args.out.resolve(), args.workdir.resolve()
    out.mkdir(parents=True, exist_ok=True)
    rank = int(os.environ.get("RANK", "0"))
    os.environ[METRICS_ENV] = str(out / f"metrics-rank{rank}.jsonl")
    tracer = flight = None
    status = {"rank": rank, "optimizer_steps": 0, "status": "running"}
    try:
        spec = parse_spec(json.loads(args.spec.read_text()), max_world_size=1 << 30)
        if spec.kind != "script":
            raise ValueError(f"spec kind is {spec.kind!r}; jobs.script_runner runs 'script'")
        if not (workdir / spec.script.entry).is_file() and \
                not spec.script.entry.startswith("-m "):
            raise ValueError(f"script.entry {spec.script.entry!r} is not a file of the "
                             "working directory")
        flight = script_flight.install(out, rank)  # hang watch: flight files, stacks
        tracer = _Tracer(spec, out, rank)
        if rank == 0 and spec.script.log_regex:
            sys.stdout = LogTee(sys.stdout, spec.script.log_regex,
                                Path(os.environ[METRICS_ENV]), lambda: tracer.steps)
        with tracer:
            try:
                run_entry(spec, workdir)
            except SystemExit as exc:  # sys.exit(0) / exit() ends a script normally
                if exc.code not in (None, 0):
                    raise
        status["status"] = "ok"
    except BaseException as exc:  # noqa: BLE001 - any failure is reported, then re-raised
        status["status"] = f"error: {type(exc).__name__}"
        (out / f"error-rank{rank}.txt").write_text(
            f"rank {rank}: {type(exc).__name__}: {exc}\n\n{traceback.format_exc()}")
        raise
    finally:
        if isinstance(sys.stdout, LogTee):
            sys.stdout.flush()
            sys.stdout = sys.stdout.stream
        if tracer is not None:
            status.update(optimizer_steps=tracer.steps, profiled_windows=tracer.windows,
                          schedule=tracer.schedule)
        status["end_ns"] = time.time_ns()
        if flight is not None:
            flight.close("ok" if status["status"] == "ok" else status["status"])
        (out / f"script-rank{rank}.json").write_text(json.dumps(status))
    return 0


if __name__ == "__main__":
    from jobs.entry import exit_now
    exit_now(main())
