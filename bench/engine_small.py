"""The post-run analysis of small real runs, side by side: the Python tables over the loaded
JSON lines (devtools.oracle.analyze_run_dir: what a run below 1 M records took until the
columnar engine answered for every run) against the columnar engine (write_analysis over the
run's Parquet files, what the worker runs now). Real runs of the reference engine (gloo,
CPU), traced with each preset's default schedule; each is converted once (the worker does that
for every run either way), and each is timed alternately in this process (the document built;
the engine's written too), imports excluded (the worker has them).

    OMP_NUM_THREADS=1 .venv/bin/python bench/engine_small.py [--steps 5 2000] [--repeat 7]
        [--presets ddp pp-1f1b]

Prints one markdown table: records, CPU s of each engine (median), their ratio, and whether
the two analyses have the same tables (names and row counts).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from devtools.launch import run_job  # noqa: E402
from devtools.oracle import analyze_run_dir  # noqa: E402
from jobs.analysis import engine, write_analysis  # noqa: E402
from jobs.analysis.storage import convert
from jobs.spec import parse_spec, resolve_preset  # noqa: E402


def cpu_of(folder: Path, which: str) -> tuple[float, dict]:
    """CPU seconds of one analysis of `folder` (the oracle's of its lines, or the engine's
    write_analysis), and the analysis."""
    c0 = time.process_time()
    if which == "python":
        doc = analyze_run_dir(folder)
        return time.process_time() - c0, doc
    head = write_analysis(folder)
    cpu = time.process_time() - c0
    assert "analysis_error" not in head, head
    return cpu, json.loads((folder / "analysis.json").read_text())


def shape(a: dict) -> dict:
    return {k: len(v) for k, v in a["tables"].items() if isinstance(v, list)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, nargs="+", default=[5, 2000])
    ap.add_argument("--presets", nargs="+", default=["ddp", "pp-1f1b"])
    ap.add_argument("--repeat", type=int, default=7)
    a = ap.parse_args()
    load0 = os.getloadavg()
    print("| preset | steps | records | Python path CPU s | columnar engine CPU s | "
          "columnar / Python | same tables |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="engine-small-") as d:
        for preset in a.presets:
            for steps in a.steps:
                spec = parse_spec(resolve_preset({"preset": preset, "train": {"steps": steps}}))
                col = Path(d) / f"{preset}-{steps}"
                run_job(col, spec.to_dict(), spec.runtime.nproc_per_node)
                lines = Path(d) / f"{preset}-{steps}-lines"  # the same run, not converted
                shutil.copytree(col, lines)
                convert.convert_run_dir(col)
                n = engine.record_count(col)
                got: dict[str, list[float]] = {"python": [], "columnar": []}
                last: dict[str, dict] = {}
                analyze_run_dir(lines)  # warm: imports, first reads
                write_analysis(col)
                for _ in range(a.repeat):  # alternated: a load drift hits both alike
                    for which, folder in (("python", lines), ("columnar", col)):
                        cpu, last[which] = cpu_of(folder, which)
                        assert last[which]["engine"] == which, last[which]["engine"]
                        got[which].append(cpu)
                py, cl = (statistics.median(got[k]) for k in ("python", "columnar"))
                same = shape(last["python"]) == shape(last["columnar"])
                print(f"| {preset} | {steps:,} | {n:,} | {py:.3f} | {cl:.3f} | {cl / py:.2f}x | "
                      f"{'yes' if same else 'no: ' + str(shape(last['columnar']))} |",
                      flush=True)
    load1 = os.getloadavg()
    print(f"load average (1 min): start {load0[0]:.2f}, end {load1[0]:.2f}")


if __name__ == "__main__":
    main()
