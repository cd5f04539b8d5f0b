"""Analysis speed (issue 5): a synthetic 4-rank x 200-step trace with a realistic record mix,
timed through `analyze_run_dir` (parse + tables + headline), `to_perfetto` and the whole
`write_analysis` (both files written).

    .venv/bin/python bench/analysis_speed.py [--ranks 4] [--steps 200] [--repeat 3]
    .venv/bin/python bench/analysis_speed.py --ranks 8 --records 0.5M,5M,50M   (issue 19)

Per step and rank the trace holds what a DP x TP run of the reference engine writes: the step
span, 2 micro-batches of forward / backward spans, 4 synchronous TP all-reduces inside each of
them, 4 asynchronous DDP bucket all-reduces overlapping the last backward, grad_sync and
wait_grads spans, the optimizer span and 5 memory samples (about 40 records). Standard library
only (plus jobs.analysis; --records: numpy, pyarrow, DuckDB); prints one markdown table.
--records compares the JSON-lines Python path with the columnar one (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from devtools.oracle import analyze_run_dir
from jobs.analysis import load_run_dir, to_perfetto, write_analysis  # noqa: E402
from jobs.analysis.export import iter_perfetto_json  # noqa: E402
from jobs.spec import parse_spec  # noqa: E402

US = 1000
ROW_GROUP_ENV = "PARALAB_BENCH_ROW_GROUP_ROWS"  # --row-group-rows, for the measured children
PER_STEP = 33  # records per rank and step


def degrees(ranks: int) -> tuple[int, int]:
    """(dp, tp) of the synthetic DP x TP mesh: tp = 2 where the world size is even. The spec's
    degrees must multiply to the world size (a fixed dp = 2, tp = 2 made any --ranks but 4 a
    SpecError) and its global batch divide by dp."""
    tp = 2 if ranks % 2 == 0 else 1
    return ranks // tp, tp


def spec_dict(ranks: int, steps: int) -> dict:
    dp, tp = degrees(ranks)
    return parse_spec({"preset": "ddp", "parallel": {"dp": dp, "tp": tp},
                       "model": {"arch": "gpt"}, "runtime": {"nproc_per_node": ranks},
                       "train": {"steps": steps, "global_batch": 4 * dp},
                       "trace": {"steps": "all"}},  # the synthetic traces hold every step
                      max_world_size=1 << 30).to_dict()


def rank_records(rank: int, ranks: int, steps: int, rng: random.Random,
                 spec: dict | None = None) -> list[dict]:
    dp, tp = degrees(ranks)
    coords = {"pp": 0, "dp": rank // tp, "tp": rank % tp}
    spec = spec if spec is not None else spec_dict(ranks, steps)
    size = {"dp": dp, "tp": tp}
    out = [{"type": "meta", "schema": 1, "rank": rank, "step": -1, "microbatch": None,
            "world_size": ranks, "coords": coords, "pid": rank, "t0_ns": 0, "clock": "host",
            "clock_offset_ns": 0, "clock_error_ns": 1000, "spec": spec}]
    seq = {"tp": 0, "dp": 0}

    def rec(typ, step, t0, t1, mb=None, **kw):
        out.append({"type": typ, "rank": rank, "step": step, "microbatch": mb,
                    "ts_ns": int(t0 * US), "dur_ns": int((t1 - t0) * US), **kw})

    def comm(step, op, axis, t0, t1, payload, mb=None, **kw):
        n = size[axis]
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
    """JSON lines per rank and, as the tracer's flusher writes them beside the lines, their
    blocks (jobs/trace_blocks.py: one per BLOCK_RECORDS records)."""
    from jobs import trace_blocks as TB
    rng = random.Random(0)
    spec = spec_dict(ranks, steps)
    enc = json.JSONEncoder().encode
    n = 0
    for r in range(ranks):
        recs = rank_records(r, ranks, steps, rng, spec)
        n += len(recs)
        path = out / f"trace-rank{r}.jsonl"
        at = 0
        with open(path, "w") as f, open(TB.blocks_path(path), "wb") as b:
            for i in range(0, len(recs), TB.BLOCK_RECORDS):
                part = recs[i:i + TB.BLOCK_RECORDS]
                text = "".join([enc(x) + "\n" for x in part])
                f.write(text)
                f.flush()  # the lines before their block, as the flusher: else the lines' file,
                # closed last, can be newer than the blocks and they are not read (blocks.usable)
                b.write(TB.encode(part, at, at + len(text), enc))
                b.flush()
                at += len(text)
    (out / "summary.json").write_text(json.dumps({"loss": [1.0] * steps}))
    return n


def make_parquet(out: Path, ranks: int, steps: int, chunk_steps: int = 20000) -> int:
    """The same record mix written straight to columnar files (jobs/analysis/storage/columnar.py):
    one generated step per rank, tiled over the steps with numpy (times shifted by a step
    period, `seq` numbering continued), so 50 M records take seconds, not an hour."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from jobs.analysis.storage import columnar
    rng = random.Random(0)
    spec = spec_dict(ranks, steps)
    schema = columnar.arrow_schema()
    n = 0
    for r in range(ranks):
        one = rank_records(r, ranks, 1, rng, spec)
        meta, body, end = one[0], one[1:-1], one[-1]
        period = end["ts_ns"]
        per_axis = {ax: sum(1 for x in body if x.get("axis") == ax) for ax in ("dp", "tp")}
        cols, args = columnar.to_columns(body)
        tmpl = pa.Table.from_arrays(
            [pa.array([r] * len(body), pa.int32())]
            + [pa.array(cols[k], schema.field(k).type) for k in columnar.COLUMNS]
            + [pa.array(args, pa.string())], schema=schema)
        seq0 = np.array([x.get("seq") or 0 for x in body], np.int64)
        seq_step = np.array([per_axis.get(x.get("axis"), 0) for x in body], np.int64)
        ts0 = np.array([x["ts_ns"] for x in body], np.int64)
        k = len(body)
        end["ts_ns"] = steps * period
        end["issued"] = end["last_completed_seq"] = {ax: c * steps for ax, c in per_axis.items()}
        md = columnar.file_metadata(meta)
        path = out / f"trace-rank{r}{columnar.SUFFIX}"
        with pq.ParquetWriter(path, schema.with_metadata(md),
                              **columnar.write_options(schema.names)) as w:  # as the converter
            for s0 in range(0, steps, chunk_steps):
                s1 = min(steps, s0 + chunk_steps)
                st = np.repeat(np.arange(s0, s1, dtype=np.int64), k)
                t = tmpl.take(pa.array(np.tile(np.arange(k), s1 - s0)))
                t = t.set_column(t.schema.get_field_index("ts_ns"), "ts_ns",
                                 pa.array(np.tile(ts0, s1 - s0) + st * period))
                t = t.set_column(t.schema.get_field_index("step"), "step", pa.array(st))
                seq = pa.array(np.tile(seq0, s1 - s0) + st * np.tile(seq_step, s1 - s0),
                               mask=np.tile([x.get("seq") is None for x in body], s1 - s0))
                t = t.set_column(t.schema.get_field_index("seq"), "seq", seq)
                w.write_table(t.replace_schema_metadata(md),
                              row_group_size=columnar.ROW_GROUP_ROWS)  # as the converter
            c, a = columnar.to_columns([end])
            w.write_table(pa.Table.from_arrays(
                [pa.array([r], pa.int32())]
                + [pa.array(c[k2], schema.field(k2).type) for k2 in columnar.COLUMNS]
                + [pa.array(a, pa.string())], schema=schema.with_metadata(md)))
        n += k * steps + 1
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


def child(mode: str, d: str) -> None:
    """One measured stage in a fresh process: its CPU seconds (every thread) and peak RSS."""
    from jobs.analysis.storage import convert
    if os.environ.get(ROW_GROUP_ENV):  # the smoke test's tiny runs: several groups a rank
        from jobs.analysis import analyze_live
        from jobs.analysis.storage import columnar
        columnar.ROW_GROUP_ROWS = int(os.environ[ROW_GROUP_ENV])
        analyze_live.MIN_PASS_ROWS = 1
    out = Path(d)
    t0, c0 = time.perf_counter(), time.process_time()
    if mode == "convert":  # the worker's: from the flusher's blocks
        convert.convert_run_dir(out)
    elif mode == "live":  # the worker's live thread over every block, then the rest after
        from jobs.analysis.storage import convert_live
        run = convert_live.LiveRun(out, analyse=True)
        run.poll()  # what the thread does while the job runs (its blocks all written)
        during = {"cpu": time.process_time() - c0, "wall": time.perf_counter() - t0}
        assert all(r.failed is None for r in run.ranks.values()), \
            {k: (r.rows, r.failed) for k, r in run.ranks.items()}
        t0, c0 = time.perf_counter(), time.process_time()
        convert.convert_run_dir(out, live=run)  # what is left after the run
        conv = {"cpu": time.process_time() - c0, "wall": time.perf_counter() - t0}
        t0, c0 = time.perf_counter(), time.process_time()
        head = write_analysis(out, live=run.analysis)  # resumed
        assert "analysis_error" not in head, head
        an = {"cpu": time.process_time() - c0, "wall": time.perf_counter() - t0}
        print(json.dumps({"during": during, "convert": conv, "analysis": an,
                          "rss": peak_rss(), "live_failed": run.analysis.failed,
                          "resumed": run.analysis.resumed}))
        return
    elif mode == "convert-lines":  # the conversion before the blocks: JSON lines, streamed
        convert.USE_BLOCKS = False
        convert.convert_run_dir(out)
    elif mode == "convert-in-memory":  # the conversion before it streamed: a file's dicts
        convert.USE_BLOCKS = False
        convert.IN_MEMORY_BYTES = 1 << 62  # every file takes the converter's in-memory path
        convert.convert_run_dir(out)
    elif mode == "scale":  # the whole post-run step on the columnar engine
        head = write_analysis(out)
        assert "analysis_error" not in head, head
        engine = json.loads((out / "analysis.json").read_text()).get("engine")
        assert engine == "columnar", engine
    else:  # "json": the Python tables over the loaded lines (the tests' oracle, the
        # product's analysis of small runs before the one engine), its document serialised
        json.dumps(analyze_run_dir(out))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(json.dumps({"wall": wall, "cpu": cpu, "rss": peak_rss()}))


def check_same_analysis(post: Path, live: Path, m: dict) -> None:
    """The analysis resumed from the live passes (folder `live`) is the post-run one
    (`post`): analysis.json the same but for the collectives' sample when that table is
    sampled (every k-th row of the instance file, whose order is by pass: a live pass ends
    elsewhere than a post-run one), and the tables kept in Parquet the same rows."""
    import pyarrow.parquet as pq

    from jobs.analysis import instances
    a, b = (json.loads((d / "analysis.json").read_text()) for d in (post, live))
    if "collectives" in (a.get("table_files") or {}):
        for x in (a, b):
            x["tables"].pop("collectives")
    assert a == b, "the analysis resumed from the live passes differs from the post-run one"
    for f in post.glob("table-*.parquet"):
        x, y = pq.read_table(f), pq.read_table(live / f.name)
        if f.name == "table-collectives.parquet":
            x, y = x.take(instances.sort_indices(x)), y.take(instances.sort_indices(y))
        assert x.equals(y), f"{f.name} differs"
    assert m["live_failed"] is None or not m["resumed"], m


def pq_rows(path: Path) -> list[int]:
    """A Parquet file's row-group sizes (the live and post-run files' shape, compared)."""
    import pyarrow.parquet as pq
    md = pq.read_metadata(path)
    return [md.row_group(i).num_rows for i in range(md.num_row_groups)]


def peak_rss() -> int:
    """This process's peak RSS since its exec: VmHWM. Not ru_maxrss, which Linux keeps across
    exec, so a child forked from this benchmark's parent (holding a generated run) started at
    the parent's size (≈ 0.7 GiB after writing 5 M JSON records)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def measure(mode: str, d: Path) -> dict:
    p = subprocess.run([sys.executable, __file__, "--child", mode, str(d)], check=True,
                       capture_output=True, text=True)
    return json.loads(p.stdout.strip().splitlines()[-1])


def parse_count(text: str) -> int:
    mult = {"k": 1e3, "m": 1e6, "g": 1e9}.get(text[-1].lower(), 1)
    return int(float(text[:-1] if mult != 1 else text) * mult)


def scale(a) -> int:
    """--records targets: per size, JSON lines (when at most --json-max records) analysed by
    the Python path, the conversion, and the whole analysis on the Parquet files by the
    columnar engine; one markdown table."""
    sizes = [parse_count(x) for x in a.records.split(",")]
    print(f"{a.ranks} ranks; DP x TP record mix ({PER_STEP} records per rank and step); "
          "CPU s count every thread; RSS is the measured process's peak")
    print("| records | path | CPU s | wall s | records / CPU s | peak RSS MiB | files MB |")
    print("|---|---|---|---|---|---|---|")
    json_rate = None
    for target in sizes:
        steps = max(2, round(target / (a.ranks * PER_STEP)))
        with tempfile.TemporaryDirectory(dir=a.tmp) as d:
            out = Path(d)
            rows, whole, lines = [], None, None  # measured below only for some sizes
            if target <= a.convert_max:
                n = make_run(out, a.ranks, steps)
                js = sum(p.stat().st_size for p in out.glob("trace-rank*.jsonl"))
                if target <= a.json_max:
                    rows.append(("JSON lines, Python tables (analyze_run_dir)",
                                 measure("json", out), js))
                if target <= a.in_memory_max:
                    whole = measure("convert-in-memory", out)
                    rows.append(("export JSON lines -> Parquet, a file's records in memory "
                                 "(before)", whole, js))
                if target <= a.lines_max:
                    lines = measure("convert-lines", out)
                    rows.append(("export JSON lines -> Parquet, streamed (before the "
                                 "blocks)", lines, js))
                bs = sum(p.stat().st_size for p in out.glob("trace-rank*.blocks"))
                twin = out.with_name(out.name + "-live")  # the same run, converted live
                shutil.copytree(out, twin)
                conv = measure("convert", out)
                assert not any(out.glob("trace-rank*.blocks")), "blocks not read"
                pqs = sum(p.stat().st_size for p in out.glob("trace-rank*.parquet"))
                rows.append(("export the flusher's blocks -> Parquet (convert.py, the "
                             "worker's)", conv, bs))
                live = measure("live", twin)
                same = all(pq_rows(p) == pq_rows(twin / p.name)
                           for p in out.glob("trace-rank*.parquet"))
                assert same, "the live conversion's files differ"
                rows.append(("blocks -> Parquet and analysis while the run goes (the "
                             "worker's live thread: convert_live.py, analyze_live.py; not "
                             "post-run)", {**live["during"], "rss": live["rss"]}, bs))
                rows.append(("after the run: the rest of the conversion",
                             {**live["convert"], "rss": live["rss"]}, bs))
                rows.append(("after the run: the analysis, resumed from the live passes "
                             f"(steps from {live['resumed']} read)",
                             {**live["analysis"], "rss": live["rss"]}, pqs))
            else:
                n = make_parquet(out, a.ranks, steps)
                pqs = sum(p.stat().st_size for p in out.glob("trace-rank*.parquet"))
            sc = measure("scale", out)
            rows.append(("Parquet, write_analysis, columnar scale path (analysis of the "
                         "Parquet files)", sc, pqs))
            if target <= a.convert_max:  # what the worker runs after a traced run: both
                rows.append(("blocks -> Parquet -> scale path (the worker's whole "
                             "post-run step without the live thread)",
                             {k: conv[k] + sc[k] for k in ("cpu", "wall")}
                             | {"rss": max(conv["rss"], sc["rss"])}, pqs))
                rows.append(("the rest of the conversion -> the resumed analysis (the "
                             "worker's whole post-run step after the live thread)",
                             {k: live["convert"][k] + live["analysis"][k]
                              for k in ("cpu", "wall")} | {"rss": live["rss"]}, pqs))
                check_same_analysis(out, twin, live)
                shutil.rmtree(twin)
            for name, m, size in rows:
                print(f"| {n:,} | {name} | {m['cpu']:.2f} | {m['wall']:.2f} | "
                      f"{n / m['cpu']:,.0f} | {m['rss'] / 2**20:,.0f} | {size / 1e6:,.1f} |")
            if target <= a.json_max:
                json_rate = n / rows[0][1]["cpu"]
            if json_rate:  # side by side: the JSON path's rate measured in this run
                print(f"| {n:,} | ratio, scale path / JSON Python path (records per CPU s) | "
                      f"{n / sc['cpu'] / json_rate:,.1f}x | | | | |")
            if whole and lines:
                print(f"| {n:,} | ratio, conversion peak RSS, in memory / streamed | "
                      f"{whole['rss'] / lines['rss']:,.1f}x | | | | |")
            if lines:
                print(f"| {n:,} | ratio, conversion CPU s, JSON lines / blocks | "
                      f"{lines['cpu'] / conv['cpu']:,.1f}x | | | | |")
            if json_rate and target <= a.convert_max:
                print(f"| {n:,} | ratio, worker's post-run step (conversion included) / JSON "
                      f"Python path | {n / rows[-2][1]['cpu'] / json_rate:,.1f}x | | | | |")
                print(f"| {n:,} | ratio, worker's post-run step after the live thread / "
                      f"JSON Python path | {n / rows[-1][1]['cpu'] / json_rate:,.1f}x | | | | |")
                print(f"| {n:,} | ratio, all CPU (the live thread, then the rest after the "
                      f"run) / JSON Python path | "
                      f"{n / (live['during']['cpu'] + rows[-1][1]['cpu']) / json_rate:,.1f}x "
                      "| | | | |")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--records", help="comma-separated sizes, e.g. 0.5M,5M,50M: the "
                    "columnar comparison instead of the per-stage table")
    ap.add_argument("--lines-max", type=parse_count, default=parse_count("5M"),
                    help="largest --records size also converted from its JSON lines (the "
                    "conversion before the flusher's blocks), side by side")
    ap.add_argument("--json-max", type=parse_count, default=parse_count("1M"),
                    help="largest size also written and analysed as JSON lines")
    ap.add_argument("--convert-max", type=parse_count, default=parse_count("1M"),
                    help="largest size also written as JSON lines and converted")
    ap.add_argument("--in-memory-max", type=parse_count, default=parse_count("5M"),
                    help="largest size also converted the old way (a file's records in "
                    "memory: ~2.4 GiB per million records of a file)")
    ap.add_argument("--tmp", default=None, help="folder for the generated runs")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--row-group-rows", type=int, default=None,
                    help="rows per Parquet row group (default the converter's 64 Ki): a tiny "
                    "run then has several per rank, and the live thread something to do")
    a = ap.parse_args(argv)
    if a.row_group_rows:
        os.environ[ROW_GROUP_ENV] = str(a.row_group_rows)
    if a.child:
        child(*a.child)
        return 0
    if a.records:
        return scale(a)
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
        pf = sum(len(c) for c in iter_perfetto_json(tr))  # built on request, not stored
    print(f"{a.ranks} ranks x {a.steps} steps: {n} records, {size / 1e6:.1f} MB of JSON lines; "
          f"tables {rows}; perfetto document {pf / 1e6:.1f} MB; best of {a.repeat}")
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
