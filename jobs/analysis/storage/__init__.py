"""A run's trace as stored: the JSON lines the tracer writes (jsonl.py: the line rules;
load.py: records in Python, the oracle's and a window's), the flusher's columnar blocks
(blocks.py), the Parquet schema every analysis reads (columnar.py), the conversion after the run
and while it goes (convert.py, convert_live.py), and the reader of the Parquet files one step
range at a time (step_ranges.py). What is computed from them is in the modules above this
package (docs/analysis.md).
"""
