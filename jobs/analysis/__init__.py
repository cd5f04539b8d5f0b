"""Trace analysis of a run (no torch): tidy per-rank tables, headline metrics, and the
Perfetto / Kineto / CSV export, by one columnar engine (engine.py). Definitions of every
metric: docs/analysis.md (its module map says where each table is computed); input contract:
docs/trace-schema.md. "oracle.X" in the docstrings is devtools/oracle/X.py: the tests' oracle,
the same tables record by record, not product code.

    analyze_folder(out_dir, spec=None)  -> {"schema", "run", "headline", "tables", "warnings"}
    write_analysis(out_dir, spec=None)  -> headline  (writes analysis.json)
    to_perfetto(traces, spec=None)      -> Trace Event Format dict
    tables_to_csv(tables, name)         -> CSV text of one table (rows_to_csv: the one writer)
    load_run_dir(out_dir) / from_records({rank: [records]}) -> Traces
"""

from .export import assign_lanes, rows_to_csv, tables_to_csv, to_perfetto
from .run import (
    ANALYSIS_FILE,
    PERFETTO_FILE,
    SCHEMA,
    TABLES,
    analyze_folder,
    write_analysis,
)
from .storage.load import Traces, from_records, load_run_dir

__all__ = ["ANALYSIS_FILE", "PERFETTO_FILE", "SCHEMA", "TABLES", "Traces",
           "analyze_folder", "assign_lanes", "from_records", "load_run_dir",
           "rows_to_csv", "tables_to_csv", "to_perfetto", "write_analysis"]
