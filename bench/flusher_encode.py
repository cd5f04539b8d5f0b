"""The flusher's encoding cost per record (issue 19): the JSON line every record gets (the live
format) and its block (jobs/trace_blocks.py, what the worker converts from), side by side on
the same records, in one process.

    .venv/bin/python bench/flusher_encode.py [--records 264000] [--repeat 5]

The records are analysis_speed.py's DP x TP mix (33 per rank and step), encoded as the
flusher does: lines 32 at a time, a block per BLOCK_RECORDS records. CPU seconds, best of
--repeat; prints one markdown table. The flusher's share of step time is bench/trace_overhead.py.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from analysis_speed import PER_STEP, rank_records  # noqa: E402

from jobs import trace_blocks as TB  # noqa: E402
from jobs.trace import _ENCODER  # noqa: E402


def lines(recs: list[dict]) -> int:
    enc, n = _ENCODER.encode, 0
    for i in range(0, len(recs), 32):  # as Tracer.flush
        n += len("".join([enc(r) + "\n" for r in recs[i:i + 32]]))
    return n


def blocks(recs: list[dict]) -> int:
    n = 0
    for i in range(0, len(recs), TB.BLOCK_RECORDS):
        n += len(TB.encode(recs[i:i + TB.BLOCK_RECORDS], 0, 0, _ENCODER.encode))
    return n


def cpu(fn, recs, repeat: int) -> tuple[float, int]:
    best, size = float("inf"), 0
    for _ in range(repeat):
        c0 = time.process_time()
        size = fn(recs)
        best = min(best, time.process_time() - c0)
    return best, size


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=264_000)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args(argv)
    steps = max(1, a.records // PER_STEP)
    recs = rank_records(0, 8, steps, random.Random(0))[1:-1]  # no meta / end: per step only
    print(f"{len(recs):,} records; CPU s, best of {a.repeat}")
    print("| encoding | CPU s | µs / record | MB |")
    print("|---|---|---|---|")
    js, jb = cpu(lines, recs, a.repeat)
    bs, bb = cpu(blocks, recs, a.repeat)
    for name, s, b in (("JSON lines (the live format)", js, jb),
                       ("blocks (jobs/trace_blocks.py)", bs, bb)):
        print(f"| {name} | {s:.3f} | {1e6 * s / len(recs):.2f} | {b / 1e6:.1f} |")
    print(f"| ratio, blocks / JSON lines (CPU) | {bs / js:.2f}x | | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
