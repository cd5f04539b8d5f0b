"""Mutation testing over a hand-written list of realistic bugs (scripts/mutants.toml).

Each mutant replaces one exact snippet of one file (the snippet must occur exactly once, so a
mutant whose code changed fails loudly instead of silently testing nothing) in a private copy
of the repository, then runs the mutant's own small test selection there. A failing selection
kills the mutant; a passing one lets it survive. Standard library only (docs/testing.md).

    python scripts/mutate.py                 every mutant (`make mutants`)
    python scripts/mutate.py --sample        the fixed CI sample (mutants marked ci = true)
    python scripts/mutate.py --only ID ...   these mutants
    python scripts/mutate.py --check         only check that every mutant still applies
    options: -j N workers (one copy each), --timeout S per mutant, --out FILE.json,
             --min-score F (exit 1 below it or on any error; default 1.0),
             --rev REV (test the tree of git revision REV instead of the working tree),
             --no-baseline (skip running each selection once unmutated first)

The copy is imported instead of the editable install: PYTHONPATH=<copy> comes before the
install's finder on sys.path, and the subprocesses the tests start (torchrun, the service)
inherit it or set PYTHONPATH to the copy's root themselves (devtools/launch.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MUTANTS = ROOT / "scripts" / "mutants.toml"
EXCLUDE = {".venv", ".git", "var", "test-artifacts", "__pycache__", ".pytest_cache",
           ".ruff_cache", "node_modules", "build"}
FIELDS = {"id", "file", "old", "new", "bug", "tests", "ci", "origin"}


def load(path: Path = MUTANTS) -> list[dict]:
    """The mutants, validated: unique ids, the required fields, no unknown ones."""
    with open(path, "rb") as f:
        ms = tomllib.load(f)["mutant"]
    seen = set()
    for m in ms:
        missing = {"id", "file", "old", "new", "bug", "tests"} - m.keys()
        if missing or m.keys() - FIELDS:
            raise ValueError(f"mutant {m.get('id')!r}: missing {sorted(missing)}, "
                             f"unknown {sorted(m.keys() - FIELDS)}")
        if m["id"] in seen:
            raise ValueError(f"mutant id {m['id']!r} appears twice")
        if m["old"] == m["new"] or not m["tests"]:
            raise ValueError(f"mutant {m['id']!r}: new equals old, or no tests")
        seen.add(m["id"])
    return ms


def problem(m: dict, root: Path) -> str | None:
    """Why mutant `m` does not apply to the tree at `root` (None: it does)."""
    p = root / m["file"]
    if not p.is_file():
        return f"{m['file']} does not exist"
    n = p.read_text().count(m["old"])
    if n != 1:
        return f"its snippet occurs {n} times in {m['file']} (must be exactly once)"
    return None


def test_files(m: dict) -> list[str]:
    return [t.split("::")[0] for t in m["tests"]]


def say(*parts) -> None:
    """A line of the report (a command-line tool: its output is the report)."""
    sys.stdout.write(" ".join(str(p) for p in parts) + "\n")
    sys.stdout.flush()


def _ignore(_dir, names):
    return [n for n in names if n in EXCLUDE]


def make_copy(dest: Path, rev: str | None) -> Path:
    """A copy of the working tree (or of git revision `rev`) at `dest`."""
    if rev is None:
        shutil.copytree(ROOT, dest, ignore=_ignore, symlinks=True)
        return dest
    dest.mkdir(parents=True)
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", rev],
                         check=True, capture_output=True).stdout
    tmp = dest.parent / (dest.name + ".tar")
    tmp.write_bytes(tar)
    with tarfile.open(tmp) as t:
        t.extractall(dest, filter="data")
    tmp.unlink()
    return dest


LIVE: set[subprocess.Popen] = set()  # running test sessions, ended with this process


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _on_term(signum, _frame):
    raise KeyboardInterrupt(f"signal {signum}")


def check_imports(copy: Path) -> None:
    """The copy's packages are the ones imported under its PYTHONPATH (not the editable
    install's): else every mutant would survive, testing the unmutated repository."""
    env = {**os.environ, "PYTHONPATH": str(copy)}
    out = subprocess.run([_python(), "-c", "import jobs, backend; print(jobs.__file__); "
                          "print(backend.__file__)"], cwd=copy, env=env, check=True,
                         capture_output=True, text=True).stdout.split()
    if not all(Path(f).resolve().is_relative_to(copy.resolve()) for f in out):
        raise AssertionError(f"the copy at {copy} is not what gets imported: {out}")


def _python() -> str:
    py = ROOT / ".venv" / "bin" / "python"
    return str(py if py.exists() else sys.executable)


def run_tests(copy: Path, tests: list[str], timeout: float) -> tuple[str, int | None, str]:
    """('pass' | 'fail' | 'timeout', return code, output tail) of `tests` in `copy`."""
    # not the calling pytest's xdist worker identity (tests/test_mutation_sample.py runs this)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_XDIST", "PYTEST_CURRENT_TEST"))
           and k != "PARALAB_TEST_CPU_REPORT"}  # the mutant's tests are counted as this one
    env = {**env, "PYTHONPATH": str(copy), "PYTHONDONTWRITEBYTECODE": "1",
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    argv = [_python(), "-m", "pytest", "-x", "-q",
            "-p", "no:cacheprovider", *tests]
    # own process group, so that a timeout ends the whole tree (torchrun, services)
    proc = subprocess.Popen(argv, cwd=copy, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    LIVE.add(proc)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(proc)
        out, _ = proc.communicate()
        return "timeout", None, out[-1500:]
    finally:
        LIVE.discard(proc)
    return ("pass" if proc.returncode == 0 else "fail"), proc.returncode, out[-1500:]


def present(copy: Path, m: dict) -> list[str]:
    """The mutant's selections whose files exist in this tree (tests land over time)."""
    return [t for t in m["tests"] if (copy / t.split("::")[0]).is_file()]


def run_one(m: dict, copy: Path, timeout: float, baseline: dict) -> dict:
    res = {"id": m["id"], "file": m["file"], "bug": m["bug"], "origin": m.get("origin", ""),
           "tests": m["tests"]}
    why = problem(m, copy)
    tests = present(copy, m)
    if why is None and not tests:
        why = "none of its test files exist"
    if why is None:
        bad = [t for t in tests if baseline.get(t, "pass") != "pass"]
        if bad:
            why = f"its tests fail without the mutant: {bad}"
    if why:
        return {**res, "result": "error", "why": why, "seconds": 0.0}
    res["ran"] = tests
    p = copy / m["file"]
    orig = p.read_text()
    t0 = time.monotonic()
    try:
        p.write_text(orig.replace(m["old"], m["new"], 1))
        outcome, rc, tail = run_tests(copy, tests, timeout)
    finally:
        p.write_text(orig)
    res["seconds"] = round(time.monotonic() - t0, 1)
    if outcome == "timeout":
        return {**res, "result": "error", "why": f"timeout after {timeout:g} s"}
    if outcome == "fail" and rc not in (1,):  # 2-5: interrupted, internal, usage, no tests
        return {**res, "result": "error", "why": f"pytest exit {rc}", "tail": tail}
    return {**res, "result": "killed" if outcome == "fail" else "survived",
            **({"tail": tail[-600:]} if outcome == "fail" else {})}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sample", action="store_true", help="only the mutants marked ci = true")
    ap.add_argument("--only", nargs="+", metavar="ID")
    ap.add_argument("--check", action="store_true", help="only check that every mutant applies")
    ap.add_argument("-j", type=int, default=1, metavar="N")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per mutant")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--rev", help="test git revision REV's tree instead of the working tree")
    ap.add_argument("--no-baseline", action="store_true",
                    help="do not run each test selection unmutated first")
    ap.add_argument("--min-score", type=float, default=1.0,
                    help="exit 1 below this score (killed / scored), or on any error")
    ap.add_argument("--mutants", type=Path, default=MUTANTS)
    a = ap.parse_args(argv)
    ms = load(a.mutants)
    if a.only:
        unknown = set(a.only) - {m["id"] for m in ms}
        if unknown:
            ap.error(f"unknown mutant id(s): {sorted(unknown)}")
        ms = [m for m in ms if m["id"] in a.only]
    elif a.sample:
        ms = [m for m in ms if m.get("ci")]
    if a.check:
        bad = [(m["id"], w) for m in ms if (w := problem(m, ROOT))]
        bad += [(m["id"], f"test file {f} does not exist") for m in ms for f in test_files(m)
                if not (ROOT / f).is_file()]
        for i, w in bad:
            say(f"{i}: {w}")
        say(f"{len(ms) - len({i for i, _ in bad})} of {len(ms)} mutants apply")
        return 1 if bad else 0

    main_thread = threading.current_thread() is threading.main_thread()
    if main_thread:  # the finally below ends the running tests and removes the copies
        prev = signal.signal(signal.SIGTERM, _on_term)
    tmp = Path(tempfile.mkdtemp(prefix="paralab-mutants-"))
    try:
        copies = [make_copy(tmp / f"w{i}", a.rev) for i in range(max(1, a.j))]
        check_imports(copies[0])
        free = list(copies)
        lock = threading.Lock()
        baseline: dict[str, str] = {}
        if not a.no_baseline:
            sels = sorted({t for m in ms for t in present(copies[0], m)})
            say(f"baseline: {len(sels)} test selections unmutated")

            def base(t):
                with lock:
                    c = free.pop()
                try:
                    baseline[t] = run_tests(c, [t], a.timeout)[0]
                finally:
                    with lock:
                        free.append(c)
                if baseline[t] != "pass":
                    say(f"  baseline {baseline[t]}: {t}")
            # one pytest run for them all first (one start-up); one run each only on failure
            everything = run_tests(copies[0], sels, a.timeout * max(1, len(sels)))[0]
            if everything == "pass":
                baseline.update(dict.fromkeys(sels, "pass"))
            else:
                with ThreadPoolExecutor(len(copies)) as ex:
                    list(ex.map(base, sels))

        def one(m):
            with lock:
                c = free.pop()
            try:
                r = run_one(m, c, a.timeout, baseline)
            finally:
                with lock:
                    free.append(c)
            say(f"{r['result']:9} {r['seconds']:7.1f}s  {m['id']}"
                  + (f"  ({r['why']})" if r.get("why") else ""))
            return r
        with ThreadPoolExecutor(len(copies)) as ex:
            results = list(ex.map(one, ms))
    finally:
        for proc in list(LIVE):
            _kill(proc)
        shutil.rmtree(tmp, ignore_errors=True)
        if main_thread:
            signal.signal(signal.SIGTERM, prev)

    killed = sum(r["result"] == "killed" for r in results)
    survived = sum(r["result"] == "survived" for r in results)
    errors = sum(r["result"] == "error" for r in results)
    scored = killed + survived
    score = killed / scored if scored else None
    say(f"\n{'id':34} {'result':9} {'s':>7}  origin")
    for r in results:
        say(f"{r['id']:34} {r['result']:9} {r['seconds']:7.1f}  {r['origin']}")
    say(f"\nmutants {len(results)}: killed {killed}, survived {survived}, error {errors}; "
          f"score {'n/a' if score is None else f'{100 * score:.1f} %'} (killed / (killed + "
          "survived))")
    if a.out:
        a.out.write_text(json.dumps({"rev": a.rev or "working tree", "killed": killed,
                                     "survived": survived, "error": errors, "score": score,
                                     "baseline": baseline, "mutants": results}, indent=1))
    return 0 if errors == 0 and score is not None and score >= a.min_score else 1


if __name__ == "__main__":
    sys.exit(main())
