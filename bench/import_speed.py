"""Importing Kineto traces (docs/imports.md): a synthetic 8-rank NCCL trace of about 1 GB of
uncompressed JSON, imported by paralab (jobs.kineto.imports.import_traces: stream, convert, the
one analysis engine, HTA's figures) and, side by side, loaded by Holistic Trace Analysis with
its temporal breakdown, each in a fresh process. Prints records per CPU-second and peak RSS.

    .venv/bin/python bench/import_speed.py [--gb 1.0] [--ranks 8] [--hta PATH]

The trace is tests/data/kineto/nccl_2gpu's rank 0 (a public HTA test trace: ResNet on 2 A100s,
NCCL) repeated: each copy's events shifted by the span of the original so the profiler steps
follow one another, for every rank (`distributedInfo` rank / world size set). `--hta PATH`: a
folder holding `hta` (pip install --target PATH holistictraceanalysis==0.5.0), added to
sys.path of HTA's process only; without it HTA's column says "not installed".
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "tests" / "data" / "kineto" / "nccl_2gpu" / "rank-0.json.gz"


def synthesize(out: Path, ranks: int, total_bytes: float) -> tuple[int, int]:
    """Write rank-R.json (uncompressed); returns (bytes, events) over all ranks."""
    doc = json.loads(gzip.decompress(SOURCE.read_bytes()))
    events = doc.pop("traceEvents")
    timed = [e for e in events if isinstance(e.get("ts"), int | float)]
    t0 = min(e["ts"] for e in timed)
    span = max(e["ts"] + e.get("dur", 0) for e in timed) - t0 + 1000.0
    base_step = max(int(e["name"].split("#")[1]) for e in timed
                    if str(e.get("name", "")).startswith("ProfilerStep#")) + 1
    one = sum(len(json.dumps(e)) + 2 for e in events)
    copies = max(1, round(total_bytes / ranks / one))
    size = n = 0
    for r in range(ranks):
        head = {**doc, "distributedInfo": {**doc["distributedInfo"], "rank": r,
                                           "world_size": ranks}}
        head.pop("baseTimeNanoseconds", None)
        path = out / f"rank-{r}.json"
        with open(path, "w") as f:
            f.write(json.dumps(head)[:-1] + ', "traceEvents": [')
            first = True
            for c in range(copies):
                for e in events:
                    e2 = dict(e)
                    if isinstance(e2.get("ts"), int | float):
                        e2["ts"] = e2["ts"] + c * span
                    name = str(e2.get("name", ""))
                    if name.startswith("ProfilerStep#"):
                        e2["name"] = f"ProfilerStep#{int(name.split('#')[1]) + c * base_step}"
                    args = e2.get("args")
                    if isinstance(args, dict) and "correlation" in args:
                        e2["args"] = {**args, "correlation": args["correlation"] + c * 10**7}
                    if isinstance(args, dict) and "External id" in args:
                        e2["args"] = {**e2["args"], "External id": args["External id"] + c * 10**7}
                    f.write(("" if first else ",") + json.dumps(e2))
                    first = False
                    n += 1
            f.write("]}")
        size += path.stat().st_size
    return size, n


PARALAB = """
import sys, time, json
from pathlib import Path
sys.path.insert(0, {root!r})
from jobs.kineto.imports import import_traces
paths = sorted(Path({src!r}).glob("rank-*.json"))
got = import_traces(paths, Path({out!r}))
print(json.dumps({{"records": got["records"], "world_size": got["world_size"]}}))
"""

HTA = """
import sys, json
sys.path.insert(0, {hta!r})
from hta.trace_analysis import TraceAnalysis
a = TraceAnalysis(trace_dir={src!r})
df = a.get_temporal_breakdown(visualize=False)
print(json.dumps({{"ranks": int(len(df))}}))
"""


def measure(code: str) -> dict:
    """CPU seconds (user + sys of the child), wall seconds and peak RSS of a fresh process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.monotonic()
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    wall = time.monotonic() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        return {"error": p.stderr.strip().splitlines()[-1] if p.stderr else p.returncode}
    return {"cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
            "wall_s": wall, "peak_rss_mib": after.ru_maxrss / 1024,
            **json.loads(p.stdout.strip().splitlines()[-1])}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--hta", help="folder holding the hta package (pip --target)")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="import-bench-"))
    try:
        src = work / "traces"
        src.mkdir()
        size, events = synthesize(src, a.ranks, a.gb * 1e9)
        print(f"{a.ranks} ranks, {size / 1e9:.2f} GB uncompressed, {events:,} events")
        # RUSAGE_CHILDREN's max RSS is the largest child so far: paralab first, then HTA
        ours = measure(PARALAB.format(root=str(ROOT), src=str(src), out=str(work / "run")))
        theirs = measure(HTA.format(hta=a.hta, src=str(src))) if a.hta else \
            {"error": "not installed (--hta PATH)"}
        print("| | CPU s | wall s | events / CPU-s | peak RSS (MiB) |")
        print("|---|---:|---:|---:|---:|")
        for name, m in (("paralab import (convert + engine + HTA figures)", ours),
                        ("HTA 0.5.0 load + temporal breakdown", theirs)):
            if "error" in m:
                print(f"| {name} | {m['error']} | | | |")
                continue
            rss = m["peak_rss_mib"] if name.startswith("paralab") or \
                m["peak_rss_mib"] > ours.get("peak_rss_mib", 0) else float("nan")
            print(f"| {name} | {m['cpu_s']:.1f} | {m['wall_s']:.1f} | "
                  f"{events / m['cpu_s']:,.0f} | {rss:,.0f} |")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
