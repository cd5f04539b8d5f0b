"""A run folder's analysis, finished or partial, by the one engine (engine.py): analyze_folder
returns the document, write_analysis stores it as `analysis.json` (the worker's call). A table
that cannot be computed is left empty with the reason in `warnings`; the document is always
written. The oracle the tests compare it with is devtools/oracle (the tables from loaded
records), not product code.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from . import assemble as A
from . import trace_sql as V
from .assemble import ANALYSIS_FILE, PERFETTO_FILE, SCHEMA, TABLES  # noqa: F401 - re-exported
from .storage import columnar


def _write_json(path: Path, obj) -> None:
    tmp = path.with_name(path.name + ".part")
    try:
        text = json.dumps(obj, separators=(",", ":"), allow_nan=False)
    except ValueError:
        text = json.dumps(A.finite(obj), separators=(",", ":"), allow_nan=False)
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def write_analysis(out_dir: Path, spec=None, live=None) -> dict:
    """Analyze `out_dir` by the columnar engine (analyze_folder), write `analysis.json`
    there, return the headline (no Perfetto file: the export builds it on request from the
    Parquet traces, perfetto.py). Never raises (a failure lands in the analysis' warnings or
    the returned headline's `analysis_error`). `live`: the worker's analyze_live.LiveAnalysis
    of the run, which the engine goes on from (else it is discarded)."""
    out_dir = Path(out_dir)
    try:
        try:
            result = analyze_folder(out_dir, spec, live)
        finally:  # what the engine did not go on from is removed
            if live is not None:
                live.discard("the columnar engine did not go on from it")
        _write_json(out_dir / ANALYSIS_FILE, result)
        return result["headline"]
    except Exception as exc:  # noqa: BLE001 - the worker must finish the run regardless
        return {"analysis_error": f"{type(exc).__name__}: {exc}"}


def analyze_folder(out_dir: Path, spec=None, live=None) -> dict:
    """The analysis of a run folder, whatever its size or layout, by the one engine (engine.
    analyze_columnar over the run's Parquet files): a folder of JSON lines only is converted
    first (convert.py, beside its lines); Parquet files that cannot be read are converted
    again from the lines, and the analysis' first warning says so. A stale Perfetto file of
    an earlier analysis is removed (it would disagree)."""
    from . import engine
    from .storage import convert
    out_dir = Path(out_dir)
    columnar.use_system_pool()
    notes: list[str] = []
    if not columnar.has_columnar(out_dir):
        convert.convert_run_dir(out_dir)
    try:
        con, hidden = _open(out_dir)
    except Exception as exc:  # noqa: BLE001 - damaged files: the JSON lines still are
        if not any(out_dir.glob("trace-rank*.jsonl")):
            raise
        notes.append(f"the run's Parquet files could not be read ({type(exc).__name__}: "
                     f"{exc}): converted again from its JSON lines")
        for p in out_dir.glob("trace-rank*" + columnar.SUFFIX):
            p.unlink()
        convert.convert_run_dir(out_dir)
        con, hidden = _open(out_dir)
    if hidden:
        notes.append("records keep " + ", ".join(f"{t} {f}" for t, f in hidden) + " in args "
                     "(a value of another type than the trace schema's): the tables read "
                     "those records without it")
    result = engine.analyze_columnar(out_dir, spec, con, live)
    result["warnings"] = notes + result["warnings"]
    (out_dir / PERFETTO_FILE).unlink(missing_ok=True)
    return result


def _open(out_dir: Path):
    """(the engine's connection over the run's Parquet files, the fields its records keep in
    args); raises when the files cannot be read."""
    from . import engine
    con = V.connect(out_dir, engine.MEMORY_LIMIT)
    return con, engine.hidden_fields(con)
