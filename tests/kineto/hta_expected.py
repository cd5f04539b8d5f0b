"""Record Holistic Trace Analysis' figures on the public traces in tests/data/kineto/.

Run with an interpreter that has ``holistictraceanalysis==0.5.0`` installed:

    python tests/kineto/hta_expected.py            # rewrites hta_expected.json
    python tests/kineto/hta_expected.py --check    # compares with the stored file

The stored values (unrounded, straight from HTA's data frames) let the comparison test run
where HTA is not installed; test_hta_live.py recomputes them when it is. Nothing here
imports paralab code: HTA is the oracle.
"""

from __future__ import annotations

import json
import logging
import math
import sys
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data" / "kineto"
EXPECTED = Path(__file__).resolve().with_name("hta_expected.json")
TRACE_SETS = ("vit_2rank", "nccl_2gpu", "rank0_of16", "rank3_of8")


def _num(x) -> float | int | None:
    x = float(x)
    if math.isnan(x):
        return None
    return int(x) if x.is_integer() else x


def hta_figures(trace_dir: Path) -> dict:
    """HTA's temporal breakdown, overlap, kernel-type breakdown and top kernels."""
    from hta.trace_analysis import TraceAnalysis

    logging.disable(logging.WARNING)  # HTA logs every parse step as a warning
    ta = TraceAnalysis(trace_dir=str(trace_dir))
    out: dict = {"temporal": {}, "overlap_pct": {}, "kernel_types": {}, "top_kernels": {}}
    tb = ta.get_temporal_breakdown(visualize=False)
    for row in tb.to_dict("records"):
        kt = row["kernel_time(us)"]
        out["temporal"][str(int(row["rank"]))] = {
            "kernel_time_us": _num(kt),
            "idle_time_us": _num(row["idle_time(us)"]),
            "compute_time_us": _num(row["compute_time(us)"]),
            "non_compute_time_us": _num(row["non_compute_time(us)"]),
            # HTA's *_pctg columns are rounded to 2 places; keep the exact ratio too.
            "idle_pct": 100.0 * row["idle_time(us)"] / kt,
            "compute_pct": 100.0 * row["compute_time(us)"] / kt,
            "non_compute_pct": 100.0 * row["non_compute_time(us)"] / kt,
            "hta_idle_time_pctg": _num(row["idle_time_pctg"]),
            "hta_compute_time_pctg": _num(row["compute_time_pctg"]),
            "hta_non_compute_time_pctg": _num(row["non_compute_time_pctg"]),
        }
    ov = ta.get_comm_comp_overlap(visualize=False)
    for row in ov.to_dict("records"):
        out["overlap_pct"][str(int(row["rank"]))] = _num(row["comp_comm_overlap_pctg"])
    for include_memory in (False, True):
        kt_df, all_df = ta.get_gpu_kernel_breakdown(
            visualize=False, include_memory_kernels=include_memory
        )
        key = "with_memory" if include_memory else "without_memory"
        out["kernel_types"][key] = {
            r["kernel_type"]: int(r["sum"]) for r in kt_df.to_dict("records")
        }
        if include_memory:
            out["top_kernels"] = [
                {"rank": int(r["rank"]), "kernel_type": r["kernel_type"], "name": r["name"],
                 "sum_us": _num(r["sum (us)"])}
                for r in all_df.to_dict("records") if r["name"] != "others"
            ]
    return out


def compute_all() -> dict:
    import hta

    return {
        "source": "holistictraceanalysis " + getattr(hta, "__version__", "0.5.0"),
        "sets": {name: hta_figures(DATA / name) for name in TRACE_SETS},
    }


def main(argv: list[str]) -> int:
    fresh = compute_all()
    if "--check" in argv:
        stored = json.loads(EXPECTED.read_text())
        same = stored["sets"] == fresh["sets"]
        sys.stdout.write("same\n" if same else "DIFFERENT\n")
        return 0 if same else 1
    EXPECTED.write_text(json.dumps(fresh, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
