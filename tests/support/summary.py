"""What a train run's summary and analysis must carry for its strategy (tests only):
per-rank bytes and memory by category for the data-parallel family; for model parallelism each
rank's pipeline peaks in the summary, and the per-stage bubble and per-axis bytes in the
analysis (their one home); the analysis headline. Shared by the service end-to-end test and
the every-preset multirun."""

from __future__ import annotations


def check_train_summary(name: str, spec, summary: dict, analysis: dict) -> None:
    s, headline = summary, analysis.get("headline")
    assert len(s["loss"]) == spec.train.steps and s["provenance"]["torch"], name
    assert headline and headline.get("step_time_s") and "analysis_error" not in headline, \
        (name, headline)
    ranks = s["ranks"]
    assert len(ranks) == spec.world_size, name
    assert all(r["memory"]["peak_bytes"]["params"] > 0 for r in ranks), name
    if spec.parallel.tp > 1 or spec.parallel.pp > 1:
        assert "stages" not in s["pipeline"] and "bytes_by_axis" not in s, name  # analysis'
        assert all(r["pipeline_peak"]["activation_bytes"] > 0
                   and r["pipeline_peak"]["inflight_microbatches"] >= 1 for r in ranks), name
        tables = analysis["tables"]
        if spec.parallel.pp > 1:
            stages = {r["stage"] for r in tables["stage_bubbles"]}
            assert stages == set(range(spec.parallel.pp)), (name, stages)
        axes = {r["axis"] for r in tables["axis_bytes"] if r["bytes_sent"]}
        expected = {a for a, d in (("tp", spec.parallel.tp), ("pp", spec.parallel.pp),
                                   ("dp", spec.parallel.dp)) if d > 1}
        assert expected <= axes, (name, axes)
    else:
        assert all(r["comm"] for r in ranks), name
        assert s["formula_check"], name
