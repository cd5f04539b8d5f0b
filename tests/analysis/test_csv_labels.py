"""A downloaded table's header says each column's unit (issue 37, item 10): fractions (0-1)
end in `_fraction`, percentages in `_pct`, and an mlp's throughput counts samples, not tokens
(the headline's `throughput_unit`, which the pages label by)."""

from __future__ import annotations

import csv
import io

from devtools.oracle import analyze_run_dir
from jobs.analysis import tables_to_csv
from jobs.analysis.labels import csv_header, rate_unit
from tests.analysis.test_partial_step import cancelled_run


def test_rate_unit_by_model_kind():
    assert rate_unit({"model": {"arch": "gpt"}}) == "tok/s"
    assert rate_unit({"model": {"arch": "mlp"}}) == "samples/s"
    assert rate_unit({"kind": "collective_bench"}) is None


def test_headers_name_fractions_and_samples():
    assert csv_header("stage_bubbles", ["stage", "inherent", "stall", "measured_idle_fraction"],
                      "tok/s") == ["stage", "inherent_fraction", "stall_fraction",
                                   "measured_idle_fraction"]
    assert csv_header("headline", ["bubble_closed_form", "overlap_pct", "tokens_per_s"],
                      "samples/s") == ["bubble_closed_form_fraction", "overlap_pct",
                                       "samples_per_s"]
    assert csv_header("expert_load", ["tokens", "share"], "samples/s") == \
        ["tokens", "share_fraction"]  # routed token assignments stay tokens


def test_an_mlp_runs_throughput_csv_says_samples(tmp_path):
    a = analyze_run_dir(cancelled_run(tmp_path / "run", False))  # the ddp preset: an mlp
    unit = a["headline"]["throughput_unit"]
    assert unit == "samples/s"
    rows = list(csv.DictReader(io.StringIO(tables_to_csv(a["tables"], "throughput", unit))))
    assert "samples_per_s" in rows[0] and "tokens_per_s" not in rows[0]
    assert [float(r["samples_per_s"]) for r in rows] == \
        [r["tokens_per_s"] for r in a["tables"]["throughput"]]
