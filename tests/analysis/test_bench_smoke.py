"""bench/analysis_speed.py's side-by-side table at a tiny size: every row and ratio printed
(the benchmark's figures live in docs/benchmarks.md; this only keeps the script working)."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_scale_table_prints_every_row_and_ratio(tmp_path):
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "analysis_speed.py"), "--ranks", "2",
         "--records", "3k,6k", "--json-max", "3k", "--convert-max", "3k", "--tmp",
         str(tmp_path), "--row-group-rows", "64"], capture_output=True, text=True, check=True,
        timeout=300).stdout
    for row in ("JSON lines, Python", "a file's records in memory (before)",
                "streamed (before the blocks)", "the flusher's blocks -> Parquet",
                "columnar scale path", "the worker's whole post-run step",
                "ratio, scale path / JSON", "ratio, conversion peak RSS",
                "ratio, conversion CPU s, JSON lines / blocks",
                "ratio, worker's post-run step", "while the run goes",
                "after the run: the rest of the conversion",
                "post-run step after the live thread",
                "ratio, all CPU (the live thread, then the rest after the run)"):
        assert row in out, (row, out)
    # the live thread fed passes (row groups of 64 rows), and the analysis resumed from them
    # is the post-run one (check_same_analysis, else the script fails)
    resumed = re.search(r"resumed from the live passes \(steps from (\d+) read\)", out)
    assert resumed and int(resumed.group(1)) > 0, out
    big = [line for line in out.splitlines() if line.startswith("| 6,")]
    assert any("scale path" in x for x in big) and not any("streamed" in x for x in big), out
    # a size past --convert-max is not converted: no conversion ratio (none left from 3k)
    assert not any("ratio, conversion" in x for x in big), out
    assert not list(tmp_path.iterdir())  # the generated runs removed


def test_the_flusher_encode_table_prints_both_encoders():
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "flusher_encode.py"), "--records", "3000",
         "--repeat", "1"], capture_output=True, text=True, check=True, timeout=300).stdout
    for row in ("JSON lines (the live format)", "blocks (jobs/trace_blocks.py)",
                "ratio, blocks / JSON lines"):
        assert row in out, (row, out)


def test_the_partial_figures_table_prints_both_paths_and_the_refresh(tmp_path):
    """bench/partial_figures.py at a tiny size: the scratch path's rows (conversion, analysis,
    refresh), the oracle's and their ratio."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "partial_figures.py"), "--records", "2k",
         "--repeat", "1", "--tmp", str(tmp_path)], capture_output=True, text=True, check=True,
        timeout=300).stdout
    for row in ("scratch: run_traces.analysis", "of which the conversion",
                "of which the analysis after it", "refresh: +1 step per rank",
                "python: analyze_run_dir", "ratio, python / scratch CPU s"):
        assert row in out, (row, out)


def test_the_read_floor_table_prints_the_pass_the_engine_and_their_ratio(tmp_path):
    """bench/read_floor.py at a tiny size: the read pass (every row read: the script checks
    the count), the engine and their ratio."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "read_floor.py"), "--records", "20k",
         "--repeat", "1", "--tmp", str(tmp_path)], capture_output=True, text=True, check=True,
        timeout=300).stdout
    for row in ("read pass: step_ranges.scan", "engine: engine.analyze_columnar",
                "ratio, engine / read pass (CPU s)"):
        assert row in out, (row, out)
    assert not list(tmp_path.iterdir())  # the generated runs removed
