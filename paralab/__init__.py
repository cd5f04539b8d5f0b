"""paralab's public API for user scripts (docs/scripts.md).

    import paralab
    paralab.log(step, loss=loss.item(), lr=lr)

Outside a paralab run (no PARALAB_METRICS_FILE in the environment) `log` does nothing, so a
script keeps running unchanged anywhere. Inside one, jobs/script_runner.py sets the variable to
this rank's file (OUT/metrics-rank{R}.jsonl) and every call appends one JSON line
{"step", "ts_ns", "metrics"}; after the run the analysis turns the lines into the run's
`scalars` (loss curve, tokens/s). Standard library only: importing it costs nothing.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import time

__all__ = ["log", "METRICS_ENV"]

METRICS_ENV = "PARALAB_METRICS_FILE"
_files: dict[str, object] = {}


def _number(name: str, value) -> float | int | None:
    """A metric as a JSON number: Python numbers and one-element tensors / arrays (.item());
    NaN and infinities become None (JSON has none)."""
    if hasattr(value, "item") and not isinstance(value, numbers.Number):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"paralab.log: metric {name!r} must be a number, got "
                        f"{type(value).__name__}")
    if isinstance(value, numbers.Integral):
        return int(value)
    value = float(value)
    return value if math.isfinite(value) else None


def log(step: int, **metrics) -> None:
    """Record `metrics` (numbers, e.g. loss=...) of optimizer step `step` (counted from 0, as
    the profiler's ProfilerStep#N). A no-op outside a paralab run."""
    path = os.environ.get(METRICS_ENV)
    if not path:
        return
    if isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 0:
        raise TypeError(f"paralab.log: step must be an integer >= 0, got {step!r}")
    line = {"step": int(step), "ts_ns": time.time_ns(),
            "metrics": {str(k): _number(k, v) for k, v in metrics.items()}}
    f = _files.get(path)
    if f is None:
        f = _files[path] = open(path, "a", buffering=1)  # noqa: SIM115 - kept open, line-buffered
    f.write(json.dumps(line, separators=(",", ":")) + "\n")
