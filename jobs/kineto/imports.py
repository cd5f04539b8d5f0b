"""Profiler traces made elsewhere -> a paralab run folder: checked, converted, analysed.

``import_traces(paths, out)`` reads each per-rank Kineto file once as a stream (reader.py),
checks the set (one file per rank, one world size, no rank missing unless allowed), writes
each rank's records in paralab's trace schema (convert.py) as ``trace-rank{R}.jsonl``, converts
them to Parquet and runs the one analysis engine (jobs.analysis.write_analysis) on them, and
adds HTA's GPU figures (breakdown.py) to ``analysis.json`` as its ``kineto`` section. Bad input
is a ValueError naming the file (and the byte offset where a parse failed); the caller removes
``out`` then, so nothing is half-stored.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from jobs.kineto import breakdown, launches
from jobs.kineto.convert import records
from jobs.kineto.reader import KinetoTraceReader
from jobs.kineto.records import RankTrace, load_rank

TRACE_SUFFIXES = (".json", ".json.gz")


def is_trace_name(name: str) -> bool:
    return name.endswith(TRACE_SUFFIXES)


def _ranges(ranks: list[int]) -> str:
    out, start = [], None
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            out.append(str(start) if start == r else f"{start}-{r}")
            start = None
    return ",".join(out)


def check_heads(paths: list[Path], names: dict[Path, str] | None = None,
                allow_missing_ranks: bool = False) -> tuple[dict[int, Path], int]:
    """{rank: path} and the world size, from each file's head (its distributedInfo), before
    any file is read whole. `names`: the uploaded name of each path, for the messages."""
    names = names or {}
    ranks: dict[int, Path] = {}
    world: tuple[int, Path] | None = None
    for p in paths:
        shown = names.get(p, p.name)
        try:
            info = KinetoTraceReader(p).distributed_info
        except ValueError as exc:
            raise ValueError(str(exc).replace(os.fspath(p), shown)) from None
        if "rank" not in info or "world_size" not in info:
            raise ValueError(f"{shown}: no distributedInfo rank / world_size (a trace of a "
                             "distributed job names both; torch.profiler writes them when the "
                             "process group is initialised before profiling)")
        r, w = int(info["rank"]), int(info["world_size"])
        if not 0 <= r < w:
            raise ValueError(f"{shown}: rank {r} outside world size {w}")
        if r in ranks:
            raise ValueError(f"{shown}: rank {r} twice (also {names.get(ranks[r], ranks[r].name)})")
        if world is not None and world[0] != w:
            raise ValueError(f"{shown}: world size {w}, but {names.get(world[1], world[1].name)}"
                             f" says {world[0]}")
        world = world or (w, p)
        ranks[r] = p
    if world is None:
        raise ValueError("no trace files (.json or .json.gz, one per rank)")
    missing = sorted(set(range(world[0])) - set(ranks))
    if missing and not allow_missing_ranks:
        raise ValueError(f"ranks {_ranges(missing)} of world size {world[0]} are missing "
                         f"(got {_ranges(sorted(ranks))}); import every rank's file, or allow "
                         "missing ranks to analyse these alone")
    return dict(sorted(ranks.items())), world[0]


def _write_rank(rt: RankTrace, world: int, out: Path, tally: dict) -> int:
    path = out / f"trace-rank{rt.rank}.jsonl"
    n = 0
    with open(path, "w") as f:
        for rec in records(rt, world):
            f.write(json.dumps(rec, separators=(",", ":"), allow_nan=False) + "\n")
            n += 1
            if rec["type"] == "comm" and "bytes_sent" not in rec:
                tally["unsized"] = tally.get("unsized", 0) + 1
            elif rec["type"] == "span" and rec["cat"] == "step":
                tally.setdefault("steps", set()).add(rec["step"])
    return n


def _silent_bytes(doc: dict, unsized: int) -> None:
    """Collectives the profiler recorded without sizes: the run's bytes are unknown, not 0."""
    doc["headline"]["comm_bytes_per_rank"] = None
    doc.setdefault("warnings", []).append(
        f"{unsized:,} collective kernel(s) without the profiler's collective arguments (sizes): "
        "their op is read from the kernel name and their bytes are unknown, so the run's "
        "bytes per rank are not stated")


def _hta_section(ranks: dict[int, RankTrace]) -> dict:
    if not any(r["stream"] != -1 for rt in ranks.values() for r in rt.hta_rows):
        return {"temporal": [], "kernel_types": [], "top_kernels": [], "rules": breakdown.RULES,
                "note": "no GPU kernels in these traces (a CPU profile): HTA's figures are "
                        "defined over GPU kernels; the analysis' step tables read the CPU ops"}
    fig = breakdown.analyse(ranks)
    temporal = [{"rank": r, **t, "overlap_pct": fig["overlap_pct"].get(r)}
                for r, t in fig["temporal"].items()]
    top = [{"rank": r, **row} for r, rows in fig["top_kernels"].items() for row in rows]
    return {"temporal": temporal, "kernel_types": fig["kernel_types"], "top_kernels": top,
            "rules": fig["rules"]}


def import_traces(paths: list[Path], out: Path, *, names: dict[Path, str] | None = None,
                  allow_missing_ranks: bool = False) -> dict:
    """Write the run folder `out` from per-rank trace files; returns {world_size, ranks,
    records, backend, headline (the analysis headline), steps (profiled steps), rank_of
    ({path: rank})}."""
    from jobs.analysis import ANALYSIS_FILE, write_analysis
    from jobs.analysis.storage.convert import convert_run_dir

    by_rank, world = check_heads(paths, names, allow_missing_ranks)
    out.mkdir(parents=True, exist_ok=True)
    loaded: dict[int, RankTrace] = {}
    counts: dict[int, int] = {}
    launch_rows: list[dict] = []
    tally: dict = {}
    for r, p in by_rank.items():
        try:
            rt = load_rank(p, r)
        except ValueError as exc:
            raise ValueError(str(exc).replace(os.fspath(p), (names or {}).get(p, p.name))) \
                from None
        counts[r] = _write_rank(rt, world, out, tally)
        if (row := launches.launch_summary(rt)) is not None:
            launch_rows.append(row)
        # HTA's figures drop the last profiled step across all ranks: they need the kernels of
        # every rank; only their rows are kept (the rest was written out above)
        rt.cpu_ops, rt.collectives, rt.kernels, rt.runtime = [], [], [], []
        loaded[r] = rt
    hta = {**_hta_section(loaded), "launches": launch_rows}
    hta["rules"] = {**hta["rules"], **launches.RULES}
    backend = next(iter(loaded.values())).distributed_info.get("backend")
    del loaded
    convert_run_dir(out)
    headline = write_analysis(out)
    doc_path = out / ANALYSIS_FILE
    if doc_path.is_file():
        doc = json.loads(doc_path.read_text())
        doc["kineto"] = hta
        if tally.get("unsized"):
            _silent_bytes(doc, tally["unsized"])
            headline = doc["headline"]
        tmp = doc_path.with_name(doc_path.name + ".part")
        tmp.write_text(json.dumps(doc, separators=(",", ":")))
        os.replace(tmp, doc_path)
    return {"world_size": world, "ranks": sorted(by_rank), "records": sum(counts.values()),
            "backend": backend, "headline": headline, "steps": len(tally.get("steps", ())),
            "rank_of": {p: r for r, p in by_rank.items()}}
