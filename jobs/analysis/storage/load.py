"""Read a run's per-rank trace files (docs/trace-schema.md) into plain per-rank record lists.

Tolerant by design: a cancelled, failed or killed run may have torn last lines, missing ranks,
no `end` record or no `meta` line. Whatever is missing goes into `warnings` instead of raising.
Reads the run's Parquet files instead when the worker converted them (columnar.py); standard
library only otherwise (pyarrow is imported only for those).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

# the JSON-lines parser (what columnar.py converts with, too)
from .jsonl import _RANK_RE, _parse, parse_file  # noqa: F401 - re-exported


@dataclass
class Traces:
    """Records per rank (sorted by `ts_ns`), meta per rank, and what was found missing."""

    ranks: dict[int, list[dict]] = field(default_factory=dict)
    meta: dict[int, dict] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    summary: dict | None = None

    @property
    def world_size(self) -> int:
        sizes = [m.get("world_size") for m in self.meta.values() if m.get("world_size")]
        return int(max(sizes)) if sizes else (max(self.ranks) + 1 if self.ranks else 0)

    def coords(self, rank: int) -> dict:
        c = (self.meta.get(rank) or {}).get("coords")
        return dict(c) if isinstance(c, dict) else {}

    def spec_dict(self) -> dict | None:
        for m in self.meta.values():
            if isinstance(m.get("spec"), dict):
                return m["spec"]
        return None

    def t0_ns(self) -> int:
        """Earliest timestamp of any record (the export's time origin)."""
        ts = [r["ts_ns"] for recs in self.ranks.values() for r in recs[:1] if "ts_ns" in r]
        ts += [m["t0_ns"] for m in self.meta.values() if isinstance(m.get("t0_ns"), int)]
        return min(ts) if ts else 0


def parse_lines(lines, rank: int, warnings: list[str]) -> tuple[list[dict], dict]:
    """Records and the meta record of one rank from an iterable of JSON lines."""
    recs, meta, bad, empty = _parse(lines)
    _check_rank(rank, recs, meta, bad, empty, warnings)
    return recs, meta


def _check_rank(rank: int, recs: list[dict], meta: dict, bad: int, empty: bool,
                warnings: list[str]) -> None:
    """What a rank's trace is missing, as warnings (the same for either storage)."""
    ends = [r.get("reason") for r in recs if r.get("type") == "end"]
    rank_warnings(rank, meta, bad, empty, ends, warnings)


def rank_warnings(rank: int, meta: dict, bad: int, empty: bool, end_reasons: list,
                  warnings: list[str]) -> None:
    """The loader's warnings of one rank from what they depend on: the file's parse state,
    its meta record and the `reason` of its `end` records in file order (what the columnar
    engine reads from the Parquet metadata and one query, without the records)."""
    check_meta(rank, meta, warnings)
    if empty:
        warnings.append(f"rank {rank}: empty trace file (killed before its first flush)")
        return
    if bad:
        warnings.append(f"rank {rank}: {bad} unreadable or untimed line(s) skipped")
    if not meta:
        warnings.append(f"rank {rank}: no meta record (coordinates unknown)")
    if not end_reasons:
        warnings.append(f"rank {rank}: no end record (the process was killed or is still "
                        "running); its trace stops at the last flush")
    elif end_reasons[-1] not in ("ok", None):
        warnings.append(f"rank {rank}: ended with reason {end_reasons[-1]!r}")


# The meta fields every reader takes as they come, and the shape each must have. A trace file
# is input (a worker uploads it, any client holding the worker credential may): a field of
# another shape is dropped with a warning, so no page fails on it.
_META_SHAPES = {"spec": (dict,), "coords": (dict,), "world_size": (int,), "t0_ns": (int,),
                "clock_error_ns": (int, float), "clock_offset_ns": (int, float),
                "hostname": (str,), "clock": (str,)}


def check_meta(rank: int, meta: dict, warnings: list[str]) -> None:
    """Drop the meta fields of the wrong shape (in place), each named in a warning."""
    bad = [k for k, types in _META_SHAPES.items() if k in meta and meta[k] is not None and (
        isinstance(meta[k], bool) or not isinstance(meta[k], types))]
    c = meta.get("coords")
    if "coords" not in bad and isinstance(c, dict) and not all(
            type(v) is int for v in c.values()):
        bad.append("coords")
    if "world_size" not in bad and isinstance(meta.get("world_size"), int) and \
            meta["world_size"] < 1:
        bad.append("world_size")
    s = meta.get("spec")
    if "spec" not in bad and isinstance(s, dict) and not all(
            isinstance(s.get(k, {}), dict) for k in ("model", "parallel", "train", "runtime")):
        bad.append("spec")
    for k in bad:
        del meta[k]
    if bad:
        warnings.append(f"rank {rank}: meta field(s) {', '.join(bad)} of the wrong shape "
                        "ignored")


def from_records(per_rank: dict[int, list[dict]], summary: dict | None = None) -> Traces:
    """Traces from in-memory records (what tests and benchmarks build)."""
    tr = Traces(summary=summary)
    for rank in sorted(per_rank):
        lines = (json.dumps(r) for r in per_rank[rank])
        recs, meta = parse_lines(lines, rank, tr.warnings)
        if recs or meta:
            tr.ranks[rank], tr.meta[rank] = recs, meta
    check_ranks(tr)
    return tr


def load_run_dir(out_dir: Path) -> Traces:
    """Every rank's trace (and `summary.json` if present) of a run folder: the Parquet files
    (columnar.py) when every `trace-rank*.jsonl` has an up-to-date one, else the JSON lines
    (a live run, or one from before runs were converted)."""
    out_dir = Path(out_dir)
    tr = Traces()
    from . import columnar
    parquet = columnar.has_columnar(out_dir)
    suffix = columnar.SUFFIX if parquet else ".jsonl"
    paths = sorted(out_dir.glob("trace-rank*" + suffix))
    if not paths:
        tr.warnings.append(f"no trace-rank*.jsonl files in {out_dir.name or out_dir}")
    for path in paths:
        m = _RANK_RE.search(path.name)
        if not m:
            continue
        rank = int(m.group(1))
        try:
            parsed = columnar.read_rank(path) if parquet else parse_file(path, rank)
        except Exception as exc:  # noqa: BLE001 - a damaged file degrades to a warning
            parsed, why = None, f"{type(exc).__name__}: {exc}"
            js = path.with_suffix(".jsonl")
            if parquet and js.is_file():  # another columnar version, or a damaged file
                parsed = parse_file(js, rank)
        else:
            why = "OSError"
        if parsed is None:
            tr.warnings.append(f"rank {rank}: cannot read {path.name} ({why})")
            continue
        recs, meta, bad, empty = parsed
        _check_rank(rank, recs, meta, bad, empty, tr.warnings)
        if recs or meta:
            tr.ranks[rank], tr.meta[rank] = recs, meta
    return finish(tr, out_dir)


def finish(tr: Traces, out_dir: Path) -> Traces:
    """The run folder's summary.json (if any) and the missing-ranks warning, for either
    loader (this one, or engine.meta_traces without records)."""
    summ = Path(out_dir) / "summary.json"
    if summ.is_file():
        try:
            summary = json.loads(summ.read_text())
        except (OSError, ValueError) as exc:  # (UnicodeDecodeError is a ValueError)
            tr.warnings.append(f"summary.json unreadable ({exc})")
        else:
            if isinstance(summary, dict):
                tr.summary = summary
            else:
                tr.warnings.append("summary.json is not a JSON object: ignored")
    check_ranks(tr)
    return tr


def check_ranks(tr: Traces) -> None:
    world = tr.world_size
    missing = [r for r in range(world) if r not in tr.ranks]
    if missing:
        tr.warnings.append(f"no trace for rank(s) {missing} of world size {world}")
