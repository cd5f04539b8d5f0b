"""A running run's partial analysis as the API serves it, side by side: the scratch path
(backend/services/run_traces.py: the shipped JSON lines converted to a scratch Parquet folder,
then the columnar engine) against the Python path it replaced (analyze_run_dir: load the lines,
Python tables). A synthetic run without its end record (bench/analysis_speed.py's record mix,
make_run), per size; each path measured in a fresh process, the two alternated over --repeat
rounds, medians reported. The scratch process also times the conversion alone
(run_traces.get), the analysis after it, and a refresh: one more step of records appended to
every rank file, then the next run_traces.analysis (a new file version: converted again in
full), what each poll of a running run's page costs.

    OMP_NUM_THREADS=1 .venv/bin/python bench/partial_figures.py [--records 10k,100k,500k]
        [--ranks 2] [--repeat 3] [--tmp DIR]

CPU s: time.process_time of the measured process (every thread), imports excluded (every
jobs.analysis module, numpy, pyarrow and duckdb are imported first, as in a warm API); peak
RSS: the process's VmHWM (ru_maxrss carries the parent's peak across exec). Prints one
markdown table.
"""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.analysis_speed import PER_STEP, make_run, parse_count, peak_rss  # noqa: E402


def preload() -> None:
    """What a warm API process has imported: every jobs.analysis module and the libraries
    they import lazily."""
    import jobs.analysis as pkg
    for m in pkgutil.iter_modules(pkg.__path__):
        try:
            importlib.import_module(f"jobs.analysis.{m.name}")
        except ImportError:
            pass
    for name in ("numpy", "pyarrow", "pyarrow.parquet", "pyarrow.compute", "duckdb"):
        try:
            importlib.import_module(name)
        except ImportError:
            pass


def timed(fn) -> tuple[object, dict]:
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    m = {"cpu": time.process_time() - c0, "wall": time.perf_counter() - t0}
    return out, {**m, "rss": peak_rss()}


def child(mode: str, run_dir: str, extra: str) -> None:
    """One measured process; prints its figures as one JSON line."""
    run, res = Path(run_dir), {}
    preload()
    if mode == "python":
        from devtools.oracle import analyze_run_dir
        doc, res["python"] = timed(lambda: analyze_run_dir(run))
        assert doc.get("tables"), doc.get("warnings")
    else:
        from backend.services import run_traces
        root = Path(tempfile.mkdtemp(prefix="partial-figures-"))
        try:
            run_traces.configure(4096, root)
            s, res["convert"] = timed(lambda: run_traces.get(run))
            assert s is not None
            (doc, folder), res["analysis"] = timed(lambda: run_traces.analysis(run, None))
            assert folder == s.dir and doc.get("partial") is True, doc.get("warnings")
            res["scratch"] = {k: res["convert"][k] + res["analysis"][k] for k in ("cpu", "wall")}
            res["scratch"]["rss"] = res["analysis"]["rss"]
            grown = json.loads(Path(extra).read_text())  # one more step per rank file
            for name, text in grown.items():
                with open(run / name, "a") as f:
                    f.write(text)
            (doc2, folder2), res["refresh"] = timed(lambda: run_traces.analysis(run, None))
            assert folder2 != folder and doc2.get("partial") is True, doc2.get("warnings")
        finally:
            shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(res))


def measure(mode: str, run: Path, extra: Path) -> dict:
    p = subprocess.run([sys.executable, __file__, "--child", mode, str(run), str(extra)],
                       check=True, capture_output=True, text=True)
    return json.loads(p.stdout.strip().splitlines()[-1])


def build(base: Path, full: Path, ranks: int, steps: int) -> tuple[int, Path]:
    """A running run of `steps` steps in `base` (no end record, no blocks) and, in a file
    beside it, each rank file's lines of step `steps`: make_run of steps + 1, split."""
    make_run(full, ranks, steps + 1)
    n, grown = 0, {}
    for path in sorted(full.glob("trace-rank*.jsonl")):
        keep, more = [], []
        for line in path.read_text().splitlines(keepends=True):
            rec = json.loads(line)
            if rec["type"] == "end":
                continue
            (more if rec.get("step") == steps else keep).append(line)
        (base / path.name).write_text("".join(keep))
        grown[path.name] = "".join(more)
        n += len(keep)
    shutil.copyfile(full / "summary.json", base / "summary.json")
    extra = base.with_name(base.name + "-step.json")
    extra.write_text(json.dumps(grown))
    return n, extra


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", default="10k,100k,500k", help="comma-separated sizes")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tmp", default=None, help="folder for the generated runs")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        child(*a.child)
        return 0
    print(f"{a.ranks} ranks; DP x TP record mix ({PER_STEP} records per rank and step), no end "
          f"record; median of {a.repeat} fresh processes per path, the paths alternated; CPU s "
          "count every thread")
    print("| records | path | CPU s | wall s | peak RSS MiB |")
    print("|---|---|---|---|---|")
    rows = (("scratch", "scratch: run_traces.analysis (conversion + columnar analysis)"),
            ("convert", "scratch, of which the conversion (run_traces.get)"),
            ("analysis", "scratch, of which the analysis after it"),
            ("refresh", "refresh: +1 step per rank, the next run_traces.analysis (re-converted; "
                        "RSS: the process's peak so far)"),
            ("python", "python: analyze_run_dir (load + Python tables)"))
    for target in (parse_count(x) for x in a.records.split(",")):
        steps = max(2, round(target / (a.ranks * PER_STEP)))
        with tempfile.TemporaryDirectory(dir=a.tmp) as d:
            base, full, work = Path(d, "run"), Path(d, "full"), Path(d, "work")
            base.mkdir()
            full.mkdir()
            n, extra = build(base, full, a.ranks, steps)
            shutil.rmtree(full)
            got: dict[str, list[dict]] = {k: [] for k, _ in rows}
            for i in range(a.repeat):
                for mode in ("scratch", "python") if i % 2 == 0 else ("python", "scratch"):
                    shutil.rmtree(work, ignore_errors=True)
                    shutil.copytree(base, work)  # the refresh grows the copy
                    for k, m in measure(mode, work, extra).items():
                        got[k].append(m)
            med = {k: {f: statistics.median(m[f] for m in ms) for f in ("cpu", "wall", "rss")}
                   for k, ms in got.items()}
            for k, name in rows:
                m = med[k]
                print(f"| {n:,} | {name} | {m['cpu']:.2f} | {m['wall']:.2f} | "
                      f"{m['rss'] / 2**20:,.0f} |")
            print(f"| {n:,} | ratio, python / scratch CPU s | "
                  f"{med['python']['cpu'] / med['scratch']['cpu']:,.1f}x | | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
