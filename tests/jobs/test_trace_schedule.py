"""Bounded tracing, unit level: the spec's `trace` section is validated with the field named,
the schedule means what torch.profiler.schedule means (warm-up steps not recorded), and the
helpers agree with each other (jobs/trace_schedule.py)."""

from __future__ import annotations

import pytest
from torch.profiler import ProfilerAction, schedule

from jobs import trace_schedule as TS
from jobs.spec import SpecError, TraceSpec, parse_spec
from jobs.trace_schedule import (
    compact_ranges,
    is_scheduled,
    keeps_span,
    parse_steps,
    predicted_trace,
    records_per_traced_step,
    traced_step_count,
    traced_steps,
)

BASE = {"parallel": {"dp": 2}, "train": {"steps": 40}}


def errors(trace: dict, **extra) -> list[dict]:
    with pytest.raises(SpecError) as exc:
        parse_spec({**BASE, **extra, "trace": trace})
    return exc.value.errors


def test_default_is_bounded_and_every_step_is_explicit():
    t = parse_spec(BASE).trace
    assert t == TraceSpec() and t.level == "layer" and not t.max_records
    assert parse_spec(BASE).to_dict()["trace"]["level"] == "layer"
    # by hand: the first 20 steps, then the last 5 of every 100, capped at 500,000 records
    assert traced_steps(t, 40) == list(range(20))
    assert traced_steps(t, 300) == [*range(20), *range(95, 100), *range(195, 200),
                                    *range(295, 300)]
    assert traced_steps(t, 300, start=150) == [*range(195, 200), *range(295, 300)]
    assert traced_step_count(t, 1_000_000) == 20 + 10_000 * 5
    assert TS.max_records(t) == 500_000 and TS.mode(t) == "default"
    every = parse_spec({**BASE, "trace": {"steps": "all"}}).trace
    assert traced_steps(every, 40) == list(range(40)) and TS.max_records(every) == 0
    # a schedule of the user's own keeps "0 = no cap"
    own = parse_spec({**BASE, "trace": {"active": 2}}).trace
    assert TS.max_records(own) == 0 and traced_steps(own, 4) == [0, 1, 2, 3]


@pytest.mark.parametrize("trace,loc,words", [
    ({"wait": 2}, ["trace", "wait"], "set trace.active > 0"),
    ({"repeat": 3}, ["trace", "repeat"], "set trace.active > 0"),
    ({"active": -1}, ["trace", "active"], ">= 0"),
    ({"level": "op"}, ["trace", "level"], "one of layer, block, step"),
    ({"max_records": 1.5}, ["trace", "max_records"], "integer"),
    ({"steps": "0-2,x"}, ["trace", "steps"], "bad part 'x'"),
    ({"steps": "5-2"}, ["trace", "steps"], "runs backwards"),
    ({"steps": "39,40"}, ["trace", "steps"], "step 40 is beyond the run"),
    ({"steps": "1", "active": 2}, ["trace", "steps"], "not both"),
    ({"steps": "all", "active": 2}, ["trace", "steps"], "leave the schedule"),
    ({"every": 2}, ["trace", "every"], "unknown field"),
])
def test_invalid_trace_sections_name_field_and_rule(trace, loc, words):
    errs = errors(trace)
    assert any(e["loc"] == loc and words in e["msg"] for e in errs), errs


def test_trace_section_is_for_train_jobs():
    errs = errors({"active": 1}, kind="collective_bench")
    assert errs[0]["loc"] == ["trace"] and "train jobs only" in errs[0]["msg"]


@pytest.mark.filterwarnings("ignore:Profiler won't be using warmup")
@pytest.mark.parametrize("wait,warmup,active,repeat", [
    (0, 0, 1, 0), (1, 1, 2, 0), (4, 2, 2, 3), (0, 3, 1, 2), (2, 0, 3, 1), (5, 1, 1, 4)])
def test_schedule_matches_torch_profiler(wait, warmup, active, repeat):
    """Traced exactly where torch.profiler records (RECORD / RECORD_AND_SAVE); its WARMUP
    steps are not traced here."""
    prof = schedule(wait=wait, warmup=warmup, active=active, repeat=repeat)
    t = TraceSpec(wait=wait, warmup=warmup, active=active, repeat=repeat)
    want = [s for s in range(60) if prof(s) in (ProfilerAction.RECORD,
                                                ProfilerAction.RECORD_AND_SAVE)]
    assert [s for s in range(60) if is_scheduled(t, s)] == want
    assert traced_steps(t, 60) == want
    for start in (0, 3, 17):
        assert traced_steps(t, 60, start) == [s for s in want if s >= start]
        assert traced_step_count(t, 60, start) == len([s for s in want if s >= start])


def test_explicit_steps_and_ranges():
    assert parse_steps("20-21, 0-2,10,2") == [0, 1, 2, 10, 20, 21]
    t = TraceSpec(steps="0-2,10,20-21")
    assert traced_steps(t, 21) == [0, 1, 2, 10, 20]
    assert traced_step_count(t, 40, 2) == 4
    assert compact_ranges([7, 0, 1, 2, 5, 8]) == "0-2,5,7-8"
    assert compact_ranges([]) == ""


def test_levels_keep_the_documented_spans():
    assert keeps_span("layer", "forward.layer", "compute")
    assert not keeps_span("block", "forward.layer", "compute")
    assert not keeps_span("block", "cp.step", "compute")
    assert keeps_span("block", "forward", "compute")
    assert keeps_span("step", "step", "step") and not keeps_span("step", "forward", "compute")


def test_predicted_trace_counts_steps_and_the_cap():
    spec = parse_spec({**BASE, "model": {"layers": 3}, "train": {"steps": 40, "grad_accum": 2},
                       "trace": {"wait": 4, "warmup": 2, "active": 2, "repeat": 3}})
    per = records_per_traced_step(spec)
    # 2 rounds x (forward, backward, 3 forward.layer, 3 backward.layer) + step, grad_sync,
    # optimizer, wait_grads (DDP buckets); mem: 2 after_forward + after_backward + after_step
    assert per == {"span": 20, "mem": 4, "comm": None, "exact": False}
    p = predicted_trace(spec)
    assert p["traced_steps"] == "6-7,14-15,22-23" and p["traced_step_count"] == 6
    # + scalars per step, meta, end and the init memory sample
    assert p["records_per_rank"] == 24 * 6 + 40 + 3
    assert p["records"] == 2 * p["records_per_rank"]
    assert p["lower_bound"] and p["bytes"] > 0
    capped = parse_spec({**BASE, "model": {"layers": 3}, "train": {"steps": 40, "grad_accum": 2},
                         "trace": {"max_records": 50}})
    assert predicted_trace(capped)["traced_step_count"] == 3  # starts at 0, 24, 48 records
    step = parse_spec({**BASE, "trace": {"level": "step", "steps": "1,3"}})
    assert predicted_trace(step)["records_per_rank"] == 2 + 40 + 2
    assert not predicted_trace(step)["lower_bound"]
    huge = parse_spec({**BASE, "train": {"steps": 1_000_000}, "trace": {"active": 1,
                                                                      "wait": 1}})
    p = predicted_trace(huge)
    assert p["traced_step_count"] == 500_000 and p["traced_steps"].endswith(",…")
