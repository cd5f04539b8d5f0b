"""What a train run's summary must carry for its strategy (tests only): per-rank bytes and
memory by category for the data-parallel family, per-stage bubble / per-axis bytes / per-stage
memory for model parallelism, and the analysis headline (the run's metrics, the worker's
`write_analysis`). Shared by the service end-to-end test and the every-preset multirun."""

from __future__ import annotations


def check_train_summary(name: str, spec, summary: dict, headline: dict | None) -> None:
    s = summary
    assert len(s["loss"]) == spec.train.steps and s["provenance"]["torch"], name
    assert headline and headline.get("step_time_s") and "analysis_error" not in headline, \
        (name, headline)
    ranks = s["ranks"]
    assert len(ranks) == spec.world_size, name
    assert all(r["memory"]["peak_bytes"]["params"] > 0 for r in ranks), name
    if spec.parallel.tp > 1 or spec.parallel.pp > 1:
        stages = s["pipeline"]["stages"]
        assert len(stages) == spec.parallel.pp, name
        assert all("idle_fraction" in st and "peak_activation_bytes" in st
                   for st in stages.values()), name
        axes = {a for per_rank in s["bytes_by_axis"].values() for a in per_rank}
        expected = {a for a, d in (("tp", spec.parallel.tp), ("pp", spec.parallel.pp),
                                   ("dp", spec.parallel.dp)) if d > 1}
        assert expected <= axes, (name, axes)
    else:
        assert all(r["comm"] for r in ranks), name
        assert s["formula_check"], name
