"""Peak memory has one definition (issue 37, item 2): a rank's peak is the sum of every
component's peak over its `mem` samples, model state + activations + the transient buffers
(ZeRO-2's communication buffers included), which is what the run page's chart stacks and what
jobs.theory predicts per rank. The headline, the memory table's `total` rows, the CSV export
and both analysis engines give that one number, equal to a hand computation from the trace.

Before: the headline (card, runs list, compare) summed model state + activations of the largest
single sample, leaving the buffers out (173 kB against the chart's and the prediction's 272 kB
on a zero2 run)."""

from __future__ import annotations

import csv
import io
import json

from devtools.oracle import analyze_run_dir
from jobs.analysis import engine, tables_to_csv
from jobs.analysis.storage import convert
from jobs.theory import predict
from tests.analysis.synth import end, mem, meta, span, write

ZERO2 = {"preset": "zero2", "train": {"steps": 3}}
PARTS = ("params", "grads", "optimizer", "activations", "comm_buffers")


def zero2_run(out):
    """2 ranks, 3 steps, samples at several phases: each component peaks at another time
    (the buffers during backward, the optimizer state after the first step), as in a real
    ZeRO-2 run; rank 1 holds a little more than rank 0. The values are the prediction's."""
    comps = predict(ZERO2)["memory"]["components"]
    per = {}
    for rank in range(2):
        extra = 1000 * rank
        recs = [meta(rank, 2, spec=ZERO2),
                mem(rank, -1, 1, params=int(comps["params"]), grads=0, optimizer=0,
                    phase="init")]
        for st in range(3):
            t = 100 * st + 10
            recs += [span(rank, st, "step", t, t + 90, cat="step"),
                     mem(rank, st, t + 30, params=int(comps["params"]), grads=0,
                         optimizer=int(comps["optimizer"]) if st else 0,
                         activations=int(comps["activations"]) + extra, phase="after_forward"),
                     mem(rank, st, t + 60, params=int(comps["params"]),
                         grads=int(comps["grads"]),
                         optimizer=int(comps["optimizer"]) if st else 0, activations=0,
                         comm_buffers=int(comps["comm_buffers"]), grads_peak=0,
                         phase="after_backward")]
        recs.append(end(rank, 400))
        per[rank] = recs
    return write(out, per), comps


def by_hand(run) -> int:
    """max over ranks of Σ_component max over the rank's samples, read from the files."""
    best = 0
    for f in sorted(run.glob("trace-rank*.jsonl")):
        peak: dict[str, int] = {}
        for line in f.read_text().splitlines():
            r = json.loads(line)
            if r.get("type") == "mem":
                for k in PARTS:
                    peak[k] = max(peak.get(k, 0), r.get(k) or 0)
        best = max(best, sum(peak.values()))
    return best


def old_definition(run) -> int:
    """The headline's former figure: the largest sample's model state + activations."""
    return max(sum(r.get(k) or 0 for k in ("params", "grads", "optimizer", "activations"))
               for f in run.glob("trace-rank*.jsonl") for r in map(json.loads,
                                                                   f.read_text().splitlines())
               if r.get("type") == "mem")


def test_one_peak_for_headline_table_csv_prediction_and_both_engines(tmp_path):
    run, comps = zero2_run(tmp_path / "run")
    want = by_hand(run)
    assert comps["comm_buffers"] > 0 and old_definition(run) < want  # the buffers count
    a = analyze_run_dir(run)
    h = a["headline"]
    assert h["peak_memory_bytes"] == want
    rows = a["tables"]["memory"]
    totals = {r["rank"]: r for r in rows if r["component"] == "total"}
    assert sorted(totals) == [0, 1]
    for rank, t in totals.items():
        parts = [r["measured_bytes"] for r in rows if r["rank"] == rank
                 and r["component"] not in ("total", "model_state")]
        assert t["measured_bytes"] == sum(parts)  # what the chart stacks
    assert max(t["measured_bytes"] for t in totals.values()) == want
    # the prediction's per-rank figure is the same sum (rank 0 holds exactly the prediction)
    per_rank = predict(ZERO2)["memory"]["per_rank_bytes"]
    assert totals[0]["predicted_bytes"] == per_rank
    assert abs(totals[0]["measured_bytes"] - per_rank) < len(PARTS)  # int() per component
    # the CSV export of the memory table: the same total rows
    got = [r for r in csv.DictReader(io.StringIO(tables_to_csv(a["tables"], "memory")))
           if r["component"] == "total"]
    assert max(int(r["measured_bytes"]) for r in got) == want
    # the columnar engine reads the same definition
    convert.convert_run_dir(run)
    col = engine.analyze_columnar(run)
    assert col["engine"] == "columnar" and col["headline"]["peak_memory_bytes"] == want
