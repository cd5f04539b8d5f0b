"""Python stacks and tracebacks of a run's ranks, as frames (standard library only):
`stack-rank{R}.txt` (faulthandler, written on SIGUSR1: jobs/faults.py) and the traceback in
`error-rank{R}.txt` (jobs/entry.py). The diagnosis (diagnose.py) names the innermost frame in
repo code ("jobs/train.py:72 in run_in_group")."""

from __future__ import annotations

import re

_FH_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+)", re.M)
_FH_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
_TB_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')
REPO_DIRS = ("jobs/",)
SKIP = ("jobs/faults.py", "jobs/trace.py")  # injector and tracer: name the code calling them


def _rel(path: str) -> str | None:
    """'jobs/train.py' for a path inside the repo's job code, None elsewhere."""
    if "site-packages" in path or "dist-packages" in path:
        return None
    for d in REPO_DIRS:
        i = path.rfind("/" + d)
        if i >= 0:
            return path[i + 1:]
        if path.startswith(d):
            return path
    return None


def parse_faulthandler(text: str) -> list[dict]:
    """The last dump in a faulthandler file: [{"thread", "current", "frames": [{"file",
    "line", "func"}] innermost first}]."""
    starts = [m.start() for m in _FH_THREAD.finditer(text)]
    threads: list[dict] = []
    for i, s in enumerate(starts):
        block = text[s:starts[i + 1] if i + 1 < len(starts) else len(text)]
        head = _FH_THREAD.match(block)
        frames = [{"file": m["file"], "line": int(m["line"]), "func": m["func"]}
                  for m in map(_FH_FRAME.match, block.splitlines()[1:]) if m]
        threads.append({"thread": head.group(2), "current": head.group(1).startswith("Current"),
                        "frames": frames})
    # several dumps (SIGUSR1 sent twice): keep the last one; a dump starts with a thread
    # list whose ids repeat
    seen, last = set(), 0
    for i, t in enumerate(threads):
        if t["thread"] in seen:
            seen, last = set(), i
        seen.add(t["thread"])
    return threads[last:]


def main_thread(threads: list[dict]) -> dict | None:
    """The training thread: the one whose outermost frame is a module's top level."""
    for t in threads:
        if t["frames"] and t["frames"][-1]["func"] == "<module>":
            return t
    return next((t for t in threads if t["current"]), threads[0] if threads else None)


def traceback_frames(text: str) -> list[dict]:
    """Frames of the (last) traceback in `text`, innermost first."""
    frames = [{"file": m["file"], "line": int(m["line"]), "func": m["func"]}
              for m in map(_TB_FRAME.match, text.splitlines()) if m]
    return frames[::-1]


def repo_frame(frames: list[dict]) -> dict | None:
    """The innermost frame in repo job code (the injector's own frames skipped), with its
    path relative to the repo; None when no frame is."""
    for f in frames:
        rel = _rel(f["file"])
        if rel and rel not in SKIP:
            return {**f, "file": rel}
    return None


def where(frame: dict | None) -> str | None:
    return f"{frame['file']}:{frame['line']} in {frame['func']}" if frame else None


def stack_summary(text: str) -> dict:
    """{"where": repo frame as 'file:line in func', "innermost": the innermost frame of the
    training thread (e.g. inside torch.distributed), "frames": the training thread's}."""
    t = main_thread(parse_faulthandler(text))
    frames = t["frames"] if t else []
    inner = frames[0] if frames else None
    return {"where": where(repo_frame(frames)), "frame": repo_frame(frames),
            "innermost": (f"{inner['file']}:{inner['line']} in {inner['func']}"
                          if inner else None), "frames": frames}
