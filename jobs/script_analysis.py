"""A finished script run's folder -> a paralab run: the runner's per-rank profiler traces go
through the Kineto import (jobs/kineto/imports.py: trace-rank{R}.jsonl, Parquet, analysis.json
with the one analysis engine), and each rank's `paralab.log` lines (OUT/metrics-rank{R}.jsonl)
become that rank's `scalars` records (loss, tokens, tokens/s; docs/trace-schema.md) merged into
its trace-rank{R}.jsonl, which is then converted and analysed again, so the run page has the
loss curve and tokens/s as for a preset. Needs only the OUT folder and the spec dict: the
worker calls `analyse_script_run(out, spec)` after torchrun exits. docs/scripts.md.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

from jobs.spec import parse_spec

SUMMARY_FILE = "script-summary.json"  # not summary.json: the train summary has its own shape


def read_metrics(out: Path) -> dict[int, dict[int, dict]]:
    """{rank: {step: metrics}} from OUT/metrics-rank{R}.jsonl (a later line of a step updates
    the earlier ones; a torn last line, as a killed rank leaves, is skipped)."""
    ranks: dict[int, dict[int, dict]] = {}
    for p in sorted(Path(out).glob("metrics-rank*.jsonl")):
        r = int(p.name[len("metrics-rank"):-len(".jsonl")])
        steps: dict[int, dict] = ranks.setdefault(r, {})
        for line in p.read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and isinstance(rec.get("step"), int):
                steps.setdefault(rec["step"], {}).update(rec.get("metrics") or {})
    return ranks


def _loss_weights(metrics: dict[int, dict[int, dict]]) -> dict[int, float]:
    """Per step, the weight of each rank's logged loss: 1 / the ranks that logged one, so the
    run's loss is their mean (DDP / FSDP log the same global-batch mean or a replica's; a
    pipeline logs it on its last stage only)."""
    n: dict[int, int] = defaultdict(int)
    for steps in metrics.values():
        for s, m in steps.items():
            if isinstance(m.get("loss"), int | float):
                n[s] += 1
    return {s: 1.0 / k for s, k in n.items()}


def merge_scalars(path: Path, rank: int, logged: dict[int, dict], weights: dict[int, float],
                  tokens: int, spec: dict) -> None:
    """Rewrite one rank's trace-rank{R}.jsonl: the profiled steps' `scalars` records get the
    logged loss and the tokens; logged steps the profiler did not record get `scalars` of
    their own (traced false, no step time); the meta names the spec and strategy."""
    tmp = path.with_name(path.name + ".part")
    seen: set[int] = set()
    last_ts = 0
    with open(path) as src, open(tmp, "w") as dst:
        lines = src.read().splitlines()
        for line in lines:
            rec = json.loads(line)
            if rec.get("type") == "meta":
                rec.update(spec=spec, strategy="script", source="script")
            elif rec.get("type") == "scalars":
                seen.add(rec["step"])
                _fill(rec, logged.get(rec["step"]), weights.get(rec["step"]), tokens)
            last_ts = max(last_ts, rec.get("ts_ns") or 0)
            if rec.get("type") == "end":  # the untraced steps before the end record
                for s in sorted(set(logged) - seen):
                    extra = {"type": "scalars", "rank": rank, "microbatch": None, "step": s,
                             "ts_ns": last_ts, "traced": False, "step_s": None}
                    _fill(extra, logged[s], weights.get(s), tokens)
                    dst.write(json.dumps(extra, separators=(",", ":"), allow_nan=False) + "\n")
                seen |= set(logged)
            dst.write(json.dumps(rec, separators=(",", ":"), allow_nan=False) + "\n")
    os.replace(tmp, path)


def _fill(rec: dict, metrics: dict | None, weight: float | None, tokens: int) -> None:
    if tokens:
        rec["tokens"] = tokens
        if rec.get("step_s"):
            rec["tokens_per_s"] = tokens / rec["step_s"]
    if not metrics:
        return
    if isinstance(metrics.get("loss"), int | float) and weight:
        rec["loss"], rec["loss_weight"] = float(metrics["loss"]), weight
    rec["metrics"] = metrics


def analyse_script_run(out: Path, spec: dict) -> dict:
    """Import OUT/kineto/rank*.json, merge the logged metrics, analyse; writes analysis.json
    and script-summary.json (kind, world_size, optimizer_steps per rank, loss per step as
    logged, profiled steps). Returns the analysis headline (as write_analysis does). Raises
    ValueError when no rank wrote a trace (the script took no profiled step)."""
    from jobs.analysis import write_analysis
    from jobs.analysis.storage.convert import convert_run_dir
    from jobs.kineto.imports import import_traces

    out = Path(out)
    js = parse_spec(spec, max_world_size=1 << 30)
    spec_dict = js.to_dict()
    paths = sorted((out / "kineto").glob("rank*.json"))
    if not paths:
        raise ValueError("no profiler trace in kineto/: the script took no profiled "
                         "optimizer step (or failed before its first one)")
    imported = import_traces(paths, out, allow_missing_ranks=True)
    kineto = None
    if (out / "analysis.json").is_file():
        kineto = json.loads((out / "analysis.json").read_text()).get("kineto")
    metrics = read_metrics(out)
    weights = _loss_weights(metrics)
    for r in imported["ranks"]:
        merge_scalars(out / f"trace-rank{r}.jsonl", r, metrics.get(r, {}), weights,
                      js.tokens_per_step, spec_dict)
    losses: dict[int, float] = defaultdict(float)
    for steps in metrics.values():
        for s, m in steps.items():
            if s in weights and isinstance(m.get("loss"), int | float):
                losses[s] += weights[s] * m["loss"]
    steps_taken = {}
    for p in sorted(out.glob("script-rank*.json")):
        st = json.loads(p.read_text())
        steps_taken[int(st["rank"])] = st.get("optimizer_steps")
    summary = {"kind": "script", "world_size": imported["world_size"],
               "optimizer_steps": steps_taken, "profiled_steps": imported["steps"],
               "loss_steps": sorted(losses),
               "loss": [losses.get(s) for s in range(max(losses) + 1)] if losses else []}
    (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=1))
    convert_run_dir(out)
    headline = write_analysis(out, js)
    doc_path = out / "analysis.json"
    if kineto is not None and doc_path.is_file():
        doc = json.loads(doc_path.read_text())
        doc["kineto"] = kineto
        tmp = doc_path.with_name(doc_path.name + ".part")
        tmp.write_text(json.dumps(doc, separators=(",", ":")))
        os.replace(tmp, doc_path)
    return headline
