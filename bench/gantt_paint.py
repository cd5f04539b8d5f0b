"""Gantt first paint of a large converted run (issue 19): the time of the run page's first
Gantt request (GET /api/runs/{id}/gantt without a step: backend/gantt_columnar.py reads the
middle step's records from the Parquet files), cold (a fresh process: imports, DuckDB over
the files, the step list) and warm (the same request again), plus a zoomed time window and
the JSON size the browser parses.

    .venv/bin/python bench/gantt_paint.py --ranks 8 --records 5M,50M

What is timed is the backend's answer, the part that grows with the run; the browser's
drawing of the bounded answer (at most max_spans segments) does not grow with it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.analysis_speed import PER_STEP, make_parquet, parse_count  # noqa: E402


def child(d: str) -> None:
    t0 = time.perf_counter()
    from backend import gantt_columnar as G  # imports count: they are part of a cold start
    run = Path(d)
    assert G.is_large(run)
    out = {}
    first = G.answer(run, step=None, t0_ms=None, t1_ms=None, max_spans=20000, px=2000)
    out["cold_s"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    again = G.answer(run, step=None, t0_ms=None, t1_ms=None, max_spans=20000, px=2000)
    out["warm_s"] = time.perf_counter() - t1
    s = first["steps"][len(first["steps"]) // 3]
    t2 = time.perf_counter()
    zoom = G.answer(run, step=None, t0_ms=s["t0_ms"], t1_ms=s["t0_ms"] + 50.0,
                    max_spans=20000, px=2000)
    out["zoom_s"] = time.perf_counter() - t2
    out["json_MB"] = len(json.dumps(again)) / 1e6
    out["segments"] = again["returned"]
    out["zoom_segments"] = zoom["returned"]
    out["steps"] = f"{len(first['steps']):,} of {first['lod']['steps_total']:,}"
    print(json.dumps(out))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--records", default="5M")
    ap.add_argument("--tmp", default=None)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        child(a.child)
        return 0
    print("| records | cold first paint s | warm s | 50 ms zoom s | answer MB | segments | "
          "steps listed |")
    print("|---|---|---|---|---|---|---|")
    for text in a.records.split(","):
        target = parse_count(text)
        with tempfile.TemporaryDirectory(dir=a.tmp) as d:
            n = make_parquet(Path(d), a.ranks, max(2, round(target / (a.ranks * PER_STEP))))
            p = subprocess.run([sys.executable, __file__, "--child", d], check=True,
                               capture_output=True, text=True)
            m = json.loads(p.stdout.strip().splitlines()[-1])
            print(f"| {n:,} | {m['cold_s']:.2f} | {m['warm_s']:.3f} | {m['zoom_s']:.3f} | "
                  f"{m['json_MB']:.2f} | {m['segments']:,} | {m['steps']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
