"""The JSON-lines trace parser (docs/trace-schema.md): one rank's file into records sorted by
`ts_ns` and its meta record, torn or untimed lines counted, not raised. load.py (the loader) and
columnar.py (the Parquet conversion) both read through it. Standard library only."""

from __future__ import annotations

import json
import re
from pathlib import Path

_RANK_RE = re.compile(r"trace-rank(\d+)\.(?:jsonl|parquet)$")


def _valid_timed(r: dict) -> bool:
    ts, dur = r.get("ts_ns"), r.get("dur_ns", 0)
    return isinstance(ts, int | float) and isinstance(dur, int | float) and dur >= 0


def _parse(lines) -> tuple[list[dict], dict, int, bool]:
    """(records sorted by ts_ns, meta, lines skipped, no line at all) of JSON lines."""
    recs, meta, bad = [], {}, 0
    lines = list(lines)
    if not any(x.strip() for x in lines):
        return [], {}, 0, True
    for line in lines:
        line = line.strip()
        if not line:
            continue
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            bad += 1
            continue
        if not isinstance(r, dict):
            bad += 1
            continue
        t = r.get("type")
        if t == "meta":
            meta = r
            continue
        if t in ("span", "comm", "mem", "instant", "end") and not _valid_timed(r):
            bad += 1
            continue
        if t == "mem" and "optim" in r:  # traces written before issue 12 named it `optim`
            r.setdefault("optimizer", r.pop("optim"))
        recs.append(r)
    recs.sort(key=lambda r: r.get("ts_ns", 0))
    return recs, meta, bad, False


def parse_file(path: Path, rank: int) -> tuple[list[dict], dict, int, bool] | None:
    """_parse of one trace file; None when it cannot be read."""
    try:
        with open(path, errors="replace") as f:
            return _parse(f)
    except OSError:
        return None
