"""The JSON-lines trace parser (docs/trace-schema.md): one rank's file into records sorted by
`ts_ns` and its meta record, torn or untimed lines counted, not raised. load.py (the loader) and
columnar.py (the Parquet conversion) both read through it. Standard library only."""

from __future__ import annotations

import json
import re
from pathlib import Path

_RANK_RE = re.compile(r"trace-rank(\d+)\.(?:jsonl|parquet)$")


TIMED = ("span", "comm", "mem", "instant", "end")  # a tuple: `in` by ==, as a "type" may be a list
# raw_decode, not json.loads: loads' wrapper (its whitespace scans, the str / bytes checks) is
# a third of its time on a trace line, and a stripped line has no whitespace for it to skip;
# a value that stops before the line's end is loads' "Extra data" error, a skipped line
_decode = json.JSONDecoder().raw_decode


KEEP, META, BAD = "keep", "meta", "bad"  # admit's verdicts

# The typed fields of timed records (docs/trace-schema.md) that every reader takes as they
# come: a record where one has another type (a foreign or damaged writer) is a BAD line, so no
# figure or page fails on it. None is allowed where a field is optional.
_NUM, _INT = (int, float), (int,)
_FIELDS = {"rank": _INT, "step": _INT, "microbatch": _INT}
FIELD_TYPES = {
    "span": {**_FIELDS, "name": (str,), "cat": (str,)},
    "comm": {**_FIELDS, "op": (str,), "axis": (str,), "group": (str,), "seq": _INT,
             "group_size": _INT, "payload_bytes": _NUM, "bytes_sent": _NUM,
             "bytes_recv": _NUM, "peer": _INT},
    "mem": _FIELDS, "instant": {**_FIELDS, "name": (str,)}, "end": _FIELDS,
}


def scan(lines, recs: list) -> tuple[dict | None, int, bool]:
    """Append the records of JSON lines to `recs`, in line order: (the last meta record or
    None, lines skipped, any non-blank line). The one line rule, for whole files (_parse) and
    for the converter's chunks of lines (convert.py)."""
    meta, bad, seen = None, 0, False
    append = recs.append
    for line in lines:
        line = line.strip()
        if not line:
            continue
        seen = True
        try:
            r, end = _decode(line)
        except json.JSONDecodeError:
            bad += 1
            continue
        if end != len(line) or not isinstance(r, dict):
            bad += 1
            continue
        a = admit(r)
        if a is KEEP:
            append(r)
        elif a is META:
            meta = r
        else:
            bad += 1
    return meta, bad, seen


def admit(r: dict) -> str:
    """What the loader does with a parsed record: KEEP it, take it as the META record, or
    count it BAD (an untimed span / comm / ...: a torn or foreign line). Renames a pre-issue-12
    `optim` in place. The one record rule, for lines (scan) and the flusher's blocks
    (blocks.py) alike."""
    t = r.get("type")
    if t == "meta":
        return META
    if t in TIMED:
        ts, dur = r.get("ts_ns"), r.get("dur_ns", 0)
        if not (isinstance(ts, int | float) and isinstance(dur, int | float) and dur >= 0):
            return BAD
        for k, types in FIELD_TYPES[t].items():
            v = r.get(k)
            if v is not None and not isinstance(v, types):
                return BAD
        if t == "mem" and "optim" in r:  # older traces named it `optim`
            r.setdefault("optimizer", r.pop("optim"))
    return KEEP


def sort_key(r: dict):
    """Records are ordered by ts_ns (stable: equal stamps keep their line order)."""
    return r.get("ts_ns", 0)


def _parse(lines) -> tuple[list[dict], dict, int, bool]:
    """(records sorted by ts_ns, meta, lines skipped, no line at all) of JSON lines."""
    recs: list[dict] = []
    meta, bad, seen = scan(lines, recs)
    if not seen:
        return [], {}, 0, True
    recs.sort(key=sort_key)
    return recs, meta if meta is not None else {}, bad, False


def parse_file(path: Path, rank: int) -> tuple[list[dict], dict, int, bool] | None:
    """_parse of one trace file; None when it cannot be read."""
    try:
        with open(path, errors="replace") as f:
            return _parse(f)
    except OSError:
        return None
