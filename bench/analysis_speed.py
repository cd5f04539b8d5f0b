"""Analysis speed (issue 5): a synthetic 4-rank x 200-step trace with a realistic record mix,
timed through `analyze_run_dir` (parse + tables + headline), `to_perfetto` and the whole
`write_analysis` (both files written).

    .venv/bin/python bench/analysis_speed.py [--ranks 4] [--steps 200] [--repeat 3]

Per step and rank the trace holds what a DP x TP run of the reference engine writes: the step
span, 2 micro-batches of forward / backward spans, 4 synchronous TP all-reduces inside each of
them, 4 asynchronous DDP bucket all-reduces overlapping the last backward, grad_sync and
wait_grads spans, the optimizer span and 5 memory samples (about 40 records). Standard library
only (plus jobs.analysis); prints one markdown table.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jobs.analysis import analyze_run_dir, load_run_dir, to_perfetto, write_analysis  # noqa: E402
from jobs.spec import parse_spec  # noqa: E402

US = 1000
SPEC = {"preset": "ddp", "parallel": {"dp": 2, "tp": 2}, "model": {"arch": "gpt"},
        "runtime": {"nproc_per_node": 4}, "train": {"steps": 200}}


def rank_records(rank: int, ranks: int, steps: int, rng: random.Random) -> list[dict]:
    coords = {"pp": 0, "dp": rank // 2, "tp": rank % 2}
    spec = parse_spec(dict(SPEC, runtime={"nproc_per_node": ranks},
                           train={"steps": steps}), max_world_size=1 << 30).to_dict()
    out = [{"type": "meta", "schema": 1, "rank": rank, "step": -1, "microbatch": None,
            "world_size": ranks, "coords": coords, "pid": rank, "t0_ns": 0, "clock": "host",
            "clock_offset_ns": 0, "clock_error_ns": 1000, "spec": spec}]
    seq = {"tp": 0, "dp": 0}

    def rec(typ, step, t0, t1, mb=None, **kw):
        out.append({"type": typ, "rank": rank, "step": step, "microbatch": mb,
                    "ts_ns": int(t0 * US), "dur_ns": int((t1 - t0) * US), **kw})

    def comm(step, op, axis, t0, t1, payload, mb=None, **kw):
        n = 2
        rec("comm", step, t0, t1, mb, op=op, axis=axis, group=axis, seq=seq[axis],
            group_size=n, payload_bytes=payload, bytes_sent=float(payload),
            bytes_recv=float(payload), **kw)
        seq[axis] += 1

    t = 0.0
    for step in range(steps):
        s0 = t
        for mb in range(2):
            for name in ("forward", "backward"):
                d = 1000 * (1 if name == "forward" else 2) * (1 + 0.05 * rng.random())
                rec("span", step, t, t + d, mb, name=name, cat="compute")
                for k in range(4):
                    a = t + d * (k + 0.3) / 4
                    comm(step, "all_reduce", "tp", a, a + d * 0.1, 1 << 16, mb, region="g")
                if name == "backward" and mb == 1:
                    for b in range(4):
                        a = t + d * (b + 1) / 5
                        comm(step, "all_reduce", "dp", a, a + 700 + rng.random() * 100,
                             1 << 20, mb, bucket=b)
                t += d
                rec("mem", step, t, t, mb, phase="after_" + name, params=1 << 20,
                    grads=1 << 20, optimizer=2 << 20, activations=1 << 18, rss_bytes=1 << 28)
                out[-1].pop("dur_ns")
        rec("span", step, t, t + 900, name="grad_sync", cat="comm")
        rec("span", step, t + 5, t + 890, name="wait_grads", cat="comm_wait")
        t += 900
        rec("span", step, t, t + 300, name="optimizer", cat="compute")
        t += 300
        rec("mem", step, t, t, phase="after_step", params=1 << 20, grads=1 << 20,
            optimizer=2 << 20, rss_bytes=1 << 28)
        out[-1].pop("dur_ns")
        rec("span", step, s0, t + 10, name="step", cat="step")
        t += 20
    rec("end", -1, t, t, reason="ok", issued=seq, last_completed_seq=seq)
    out[-1].pop("dur_ns")
    return out


def make_run(out: Path, ranks: int, steps: int) -> int:
    rng = random.Random(0)
    n = 0
    for r in range(ranks):
        recs = rank_records(r, ranks, steps, rng)
        n += len(recs)
        (out / f"trace-rank{r}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in recs))
    (out / "summary.json").write_text(json.dumps({"loss": [1.0] * steps}))
    return n


def best(fn, repeat: int) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process), each the best of `repeat`: CPU time is
    the figure to compare on a shared machine, wall time what a user waits."""
    wall, cpu = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return min(wall), min(cpu)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as d:
        out = Path(d)
        n = make_run(out, a.ranks, a.steps)
        size = sum(p.stat().st_size for p in out.glob("trace-rank*.jsonl"))
        tr = load_run_dir(out)
        t_load = best(lambda: load_run_dir(out), a.repeat)
        t_an = best(lambda: analyze_run_dir(out), a.repeat)
        t_pf = best(lambda: to_perfetto(tr), a.repeat)
        t_all = best(lambda: write_analysis(out), a.repeat)
        res = analyze_run_dir(out)
        rows = {k: len(v) for k, v in res["tables"].items()}
        pf = (out / "trace.perfetto.json").stat().st_size
    print(f"{a.ranks} ranks x {a.steps} steps: {n} records, {size / 1e6:.1f} MB of JSON lines; "
          f"tables {rows}; perfetto file {pf / 1e6:.1f} MB; best of {a.repeat}")
    print("| stage | wall s | CPU s | records / CPU s |")
    print("|---|---|---|---|")
    for name, (w, c) in (("load (parse JSON lines)", t_load),
                         ("analyze_run_dir (load + tables)", t_an),
                         ("to_perfetto (loaded traces)", t_pf),
                         ("write_analysis (all, files written)", t_all)):
        print(f"| {name} | {w:.3f} | {c:.3f} | {n / c:,.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
