"""The reading floor (issue 39): the columnar engine's whole post-run analysis against one pass
that only reads what it reads. A synthetic converted run per size (bench/analysis_speed.py's
record mix, make_parquet), then, each in a fresh process, alternated over --repeat rounds,
medians reported:

    read pass  the engine's read without its consumers: step_ranges.open_files with
               one_read.columns() (columns, dictionary columns), then every pass as
               OneRead.read takes them (scan: the setup rows, then each step range of
               step_sweep.CHUNK_RECORDS rows), each column of each pass's tables decoded to
               numpy as the consumers do (dictionary indices, null masks), then dropped
    engine     engine.analyze_columnar(out_dir) (the whole post-run analysis, no live
               thread) on a fresh copy of the run's folder (it writes table-*.parquet)

    OMP_NUM_THREADS=1 .venv/bin/python bench/read_floor.py [--records 5M] [--ranks 8]
        [--repeat 3] [--tmp DIR]

CPU s: time.process_time of the measured process (every thread); imports excluded (every
jobs.analysis module, numpy, pyarrow and duckdb imported first); peak RSS: the process's
VmHWM (analysis_speed.peak_rss). Prints one markdown table, with the ratio engine / read pass
of CPU s per size.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.analysis_speed import PER_STEP, make_parquet, parse_count, peak_rss  # noqa: E402
from bench.partial_figures import preload  # noqa: E402

MODES = (("read", "read pass: step_ranges.scan over one_read.columns(), every column decoded, "
                  "no consumer"),
         ("engine", "engine: engine.analyze_columnar (whole post-run analysis)"))


def touch(col) -> int:
    """Decodes one column of a pass's table to numpy as the consumers do (a dictionary's
    indices and values, a null mask, the values with nulls filled); the bytes made."""
    import numpy as np
    import pyarrow as pa
    a = col.combine_chunks() if hasattr(col, "combine_chunks") else col
    made = 0
    if a.null_count:
        made += np.asarray(a.is_null()).nbytes
    if pa.types.is_dictionary(a.type):
        made += len(a.dictionary.to_pylist())
        a = a.indices
    if a.null_count:
        a = a.fill_null(pa.scalar(False if pa.types.is_boolean(a.type) else 0, a.type))
    return made + np.asarray(a.to_numpy(zero_copy_only=False)).nbytes


def read_pass(out_dir: Path) -> dict:
    """The engine's read (OneRead.read) with no consumer: its passes, rows and bytes made."""
    from jobs.analysis import one_read
    from jobs.analysis import step_sweep as NS
    from jobs.analysis.storage import step_ranges
    cols, dicts = one_read.columns()
    files = step_ranges.open_files(out_dir, cols, dicts)
    passes = rows = made = 0
    for _lo, _hi, tabs in step_ranges.scan(files, NS.CHUNK_RECORDS):
        passes += 1
        for _rank, t in sorted(tabs.items()):
            rows += t.num_rows
            for c in t.columns:
                made += touch(c)
        del tabs
    return {"passes": passes, "rows": rows, "bytes": made}


def child(mode: str, out_dir: str) -> None:
    """One measured process; prints its figures as one JSON line."""
    preload()
    from jobs.analysis import engine
    out = Path(out_dir)
    t0, c0 = time.perf_counter(), time.process_time()
    if mode == "read":
        extra = read_pass(out)
    else:
        doc = engine.analyze_columnar(out)
        extra = {"tables": len(doc.get("tables") or {}), "warnings": len(doc.get("warnings")
                                                                          or [])}
    m = {"cpu": time.process_time() - c0, "wall": time.perf_counter() - t0, "rss": peak_rss()}
    print(json.dumps({**m, **extra}))


def measure(mode: str, out_dir: Path) -> dict:
    p = subprocess.run([sys.executable, __file__, "--child", mode, str(out_dir)], check=True,
                       capture_output=True, text=True)
    return json.loads(p.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", default="5M", help="comma-separated sizes (suffixes k, M)")
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tmp", default=None, help="folder for the generated runs")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        child(*a.child)
        return 0
    print(f"{a.ranks} ranks; DP x TP record mix ({PER_STEP} records per rank and step); median "
          f"of {a.repeat} fresh processes per row, the two alternated; CPU s count every thread")
    print("| records | what | CPU s | wall s | peak RSS MiB |")
    print("|---|---|---|---|---|")
    for target in (parse_count(x) for x in a.records.split(",")):
        steps = max(2, round(target / (a.ranks * PER_STEP)))
        with tempfile.TemporaryDirectory(prefix="read-floor-", dir=a.tmp) as d:
            base, work = Path(d, "run"), Path(d, "work")
            base.mkdir()
            n = make_parquet(base, a.ranks, steps)
            got: dict[str, list[dict]] = {k: [] for k, _ in MODES}
            for i in range(a.repeat):
                for mode in ("read", "engine") if i % 2 == 0 else ("engine", "read"):
                    folder = base
                    if mode == "engine":  # it writes its tables beside the rank files
                        shutil.rmtree(work, ignore_errors=True)
                        shutil.copytree(base, work)
                        folder = work
                    m = measure(mode, folder)
                    if mode == "read":
                        assert m["rows"] == n, (m, n)  # every record read once
                    got[mode].append(m)
            shutil.rmtree(work, ignore_errors=True)
            med = {k: {f: statistics.median(m[f] for m in ms) for f in ("cpu", "wall", "rss")}
                   for k, ms in got.items()}
            for k, name in MODES:
                m = med[k]
                if k == "read":
                    name += f" ({got[k][0]['passes']} passes)"
                print(f"| {n:,} | {name} | {m['cpu']:.2f} | {m['wall']:.2f} | "
                      f"{m['rss'] / 2**20:,.0f} |", flush=True)
            print(f"| {n:,} | ratio, engine / read pass (CPU s) | "
                  f"{med['engine']['cpu'] / med['read']['cpu']:,.2f}x | | |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
