"""The columnar scale path (issue 19, jobs/analysis/engine.py): the whole analysis of a
converted run without its records in Python. The Python path over the same run is the
oracle: every table, the headline, the warnings and the run section must be equal (floats to
1e-9 relative: DuckDB / numpy sum in another order where no sequential sum is needed)."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest

from devtools.oracle import analyze_run_dir
from jobs.analysis import engine, write_analysis
from jobs.analysis import step_sweep as NS
from jobs.analysis import trace_sql as V
from jobs.analysis.storage import convert
from tests.analysis.test_columnar import dp_tp_run

ENGINE_ONLY = ("engine", "table_files")  # what the scale path adds


def same(a, b, path="") -> None:
    """a == b, floats within 1e-9 relative (1e-15 absolute); says where they differ."""
    if isinstance(a, float) and isinstance(b, float | int) and not isinstance(b, bool):
        assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15), (path, a, b)
    elif isinstance(a, int) and isinstance(b, float) and not isinstance(a, bool):
        assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15), (path, a, b)
    elif isinstance(a, dict) and isinstance(b, dict):
        assert sorted(a) == sorted(b), (path, sorted(set(a) ^ set(b)))
        for k in a:
            same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), (path, len(a), len(b))
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            same(x, y, f"{path}[{i}]")
    else:
        assert a == b, (path, a, b)


def both(run):
    """(oracle, scale path) analyses of one converted run."""
    want = analyze_run_dir(run)
    got = engine.analyze_columnar(run)
    assert want["engine"] == "python" and got["engine"] == "columnar"
    for k in ENGINE_ONLY:
        want.pop(k, None)
    return want, got


def check(run):
    want, got = both(run)
    files = got.pop("table_files")
    got.pop("engine")
    same(got, want)
    return want, files


@pytest.mark.parametrize("kw", [{}, {"drop": (1, 2)}, {"unfinished": (2, 3)},
                                {"drop": (2, 4), "unfinished": (1, 5), "steps": 6}])
def test_scale_path_equals_the_python_path(tmp_path, kw):
    run = dp_tp_run(tmp_path / "run", **kw)
    convert.convert_run_dir(run)
    want, files = check(run)
    assert files == {}  # small tables: whole in analysis.json, no table file left
    assert not list(run.glob("table-*.parquet"))
    assert want["tables"]["collectives"] and want["tables"]["stragglers"]


def test_several_step_ranges_give_the_same_analysis(tmp_path, monkeypatch):
    monkeypatch.setattr(NS, "CHUNK_RECORDS", 30)  # one step range per step or two
    run = dp_tp_run(tmp_path / "run", steps=7, drop=(0, 3))
    convert.convert_run_dir(run)
    check(run)


def test_real_zero3_run_equals_the_python_path(zero3_run, tmp_path):
    run = tmp_path / "zero3"
    shutil.copytree(zero3_run, run, ignore=shutil.ignore_patterns("*.parquet", "table-*",
                                                                  "analysis.json"))
    convert.convert_run_dir(run)
    want, _ = check(run)
    assert want["tables"]["memory"] and want["tables"]["axis_bytes"]


def test_large_tables_stay_in_parquet_and_analysis_json_keeps_a_sample(tmp_path,
                                                                       monkeypatch):
    run = dp_tp_run(tmp_path / "run", steps=6)
    convert.convert_run_dir(run)
    want = analyze_run_dir(run)["tables"]
    monkeypatch.setattr(engine, "JSON_ROWS", 5)
    head = write_analysis(run)
    assert "analysis_error" not in head, head
    got = json.loads((run / "analysis.json").read_text())
    assert got["engine"] == "columnar"
    assert not (run / "trace.perfetto.json").exists()  # streamed from Parquet on request
    files = got["table_files"]
    assert set(files) == {"step_rank", "collectives", "throughput", "stragglers"} & {
        k for k in engine.BIG if len(want[k]) > 5}
    for name, info in files.items():
        rows = want[name]
        assert info["rows"] == len(rows) and info["file"] == f"table-{name}.parquet"
        same(got["tables"][name], rows[::info["stride"]], name)  # every k-th row
        total, page = engine.table_rows(run, name, 3, 4)
        assert total == len(rows)
        same(page, rows[3:7], name)
        same(engine.table_rows(run, name)[1], rows, name)


def test_every_run_takes_the_columnar_engine_a_folder_of_lines_converted_first(tmp_path):
    """One engine for every run, whatever its size (a 3-step run here): a folder of JSON
    lines only (a lost worker's) is converted beside its lines first, then analysed by the
    same engine; its tables equal the oracle's (the Python tables over the loaded lines)."""
    from jobs.analysis.storage import columnar
    lines = dp_tp_run(tmp_path / "lines")
    want = analyze_run_dir(lines)
    assert not columnar.has_columnar(lines)
    write_analysis(lines)
    assert columnar.has_columnar(lines)  # converted beside the lines
    got = json.loads((lines / "analysis.json").read_text())
    assert got["engine"] == "columnar" and want["engine"] == "python"
    assert not (lines / "trace.perfetto.json").exists()  # built on request (GET /export)
    for name in ("step_rank", "collectives", "throughput"):
        same(got["tables"][name], want["tables"][name], name)
    assert got["headline"] == want["headline"]


def test_meta_traces_carry_the_loaders_warnings(tmp_path):
    from jobs.analysis import load_run_dir
    run = dp_tp_run(tmp_path / "run", unfinished=(1, 2))
    (run / "trace-rank2.jsonl").write_text("")  # killed before its first flush
    convert.convert_run_dir(run)
    tr = engine.meta_traces(run, V.connect(run))
    assert tr.warnings == load_run_dir(run).warnings
    assert any("empty trace file" in w for w in tr.warnings)
    assert sorted(tr.ranks) == [0, 1, 3]


def test_files_of_many_row_groups_give_the_same_analysis(tmp_path, monkeypatch):
    """A real-size run's files hold many row groups, each with its own string dictionaries
    and step statistics: rewritten here with 9 rows per group, the analysis is the same."""
    import pyarrow.parquet as pq
    monkeypatch.setattr(NS, "CHUNK_RECORDS", 40)
    monkeypatch.setattr(NS, "CHUNK_RECORDS", 40)
    run = dp_tp_run(tmp_path / "run", steps=6, drop=(2,))
    convert.convert_run_dir(run)
    for p in run.glob("trace-rank*.parquet"):
        t = pq.read_table(p)
        pq.write_table(t, p, row_group_size=9)
        assert pq.ParquetFile(p).metadata.num_row_groups > 3
    check(run)


def test_the_sweeps_exact_fallbacks_give_the_same_step_rank(tmp_path, monkeypatch):
    """step_sweep packs (step, time) into one int64 where a range's steps fit; where they would
    not (steps too many and too long), lexsort and per-step loops answer: forced here, the
    same rows."""
    from jobs.analysis import step_sweep
    run = dp_tp_run(tmp_path / "run", steps=5, drop=(1, 3))
    convert.convert_run_dir(run)
    packed = [{k: v.tolist() for k, v in c.items()} for c in step_sweep.build(run)]
    monkeypatch.setattr(step_sweep, "PACK_LIMIT", 0)
    assert not step_sweep._Pack(np.zeros(1, np.int64), np.ones(1, np.int64)).ok
    exact = [{k: v.tolist() for k, v in c.items()} for c in step_sweep.build(run)]
    assert exact == packed and any(x for c in packed for x in c["overlap_ns"])


@pytest.mark.parametrize("n", [0, 1, 5, 6, 11, 40, 41, 333])
def test_the_streamed_sample_is_every_kth_row_of_the_whole_table(monkeypatch, n):
    """Sampler over batches of any sizes keeps exactly rows 0, k, 2k, ... with k =
    stride_of(n), the smallest power of two leaving at most JSON_ROWS rows."""
    import random

    import pyarrow as pa
    monkeypatch.setattr(engine, "JSON_ROWS", 5)
    table = pa.table({"i": list(range(n))})
    rng = random.Random(n)
    s, at = engine.Sampler(), 0
    while at < n or not s.parts:
        size = rng.choice([0, 1, 3, 17, 64])
        s.add(table.slice(at, size))
        at += size
    got, k = s.result()
    assert k == engine.stride_of(n) and -(-n // k) <= 5 and (k == 1 or -(-n // (k // 2)) > 5)
    assert got.column("i").to_pylist() == list(range(0, n, k))


def test_a_run_without_moe_records_skips_their_scan(tmp_path, monkeypatch):
    """axis_sums's read says whether MoE records exist; without them the scale path queries
    none (sparse(None)), with the same analysis."""
    from jobs.analysis import axis_sums
    run = dp_tp_run(tmp_path / "run")
    convert.convert_run_dir(run)
    assert axis_sums.axis_sums(run)["rare"] is False
    seen, real = [], engine.sparse
    monkeypatch.setattr(engine, "sparse", lambda con, tr, where: seen.append(where)
                        or real(con, tr, where))
    check(run)
    assert None in seen and engine.RARE not in seen


def test_a_failing_consumer_of_the_one_read_leaves_only_its_table_out(tmp_path, monkeypatch):
    """one_read.one_read feeds the step sweep, the instances and the axis sums from one
    read: the sweep raising leaves step_rank out (said why), the others equal the oracle's."""
    from jobs.analysis import step_sweep
    run = dp_tp_run(tmp_path / "run")
    convert.convert_run_dir(run)
    want = analyze_run_dir(run)

    def boom(tabs, lo):
        raise RuntimeError("sweep broke")
        yield
    monkeypatch.setattr(step_sweep, "rows_of", boom)
    got = engine.analyze_columnar(run)
    assert "step_rank: not computed (RuntimeError: sweep broke)" in got["warnings"]
    assert got["tables"]["step_rank"] == [] and want["tables"]["step_rank"]
    for name in ("collectives", "axis_bytes", "bandwidth"):
        same(got["tables"][name], want["tables"][name], name)


def test_failed_instances_leave_no_partial_file_and_the_rest_reads_again(tmp_path,
                                                                         monkeypatch):
    """The instances raising after a first batch: their partial file is removed (no table
    reads a part of them), step_rank and the axis sums come from reads of their own."""
    from jobs.analysis import instances
    monkeypatch.setattr(NS, "CHUNK_RECORDS", 30)  # several passes: a batch is written first
    run = dp_tp_run(tmp_path / "run", steps=6)
    convert.convert_run_dir(run)
    want = analyze_run_dir(run)
    real, calls = instances._compute, []

    def flaky(tab, ctx, carry_step):
        calls.append(carry_step)
        if len(calls) == 3:
            raise RuntimeError("instances broke")
        return real(tab, ctx, carry_step)
    monkeypatch.setattr(instances, "_compute", flaky)
    got = engine.analyze_columnar(run)
    assert len(calls) == 3
    assert "collectives: not computed (RuntimeError: instances broke)" in got["warnings"]
    assert not (run / "table-collectives.parquet").exists()
    assert got["tables"]["collectives"] == [] and got["tables"]["bandwidth"] == []
    for name in ("step_rank", "axis_bytes"):
        same(got["tables"][name], want["tables"][name], name)


def test_a_field_kept_in_args_is_told_by_record_type(tmp_path):
    """A value of another type than its column's goes to `args` (columnar.to_columns), where
    SQL cannot see it: in_args says so for that record type and field only (one scan of
    the args keys per connection); the one engine reads that record without it, and the
    analysis' first warning names the field."""
    run = dp_tp_run(tmp_path / "run")
    path = run / "trace-rank0.jsonl"
    recs = [json.loads(x) for x in path.read_text().splitlines()]
    i = next(i for i, r in enumerate(recs) if r["type"] == "comm" and r["step"] == 1)
    # a string in an int column (not one of the loader's typed fields, jsonl.FIELD_TYPES,
    # which make the line a skipped one instead)
    recs[i]["bucket"] = "late"
    j = next(j for j, r in enumerate(recs) if r["type"] == "span" and r["cat"] == "step")
    recs[j]["stage"] = "first"  # a pipeline field, read from step spans too
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    convert.convert_run_dir(run)
    con = V.connect(run)
    assert V.in_args(con, "comm", ("step", "bucket")) and not V.in_args(con, "comm", ("step",))
    assert not V.in_args(con, "span", ("bucket",))
    assert ("comm", "bucket") in V.args_keys(con)
    assert engine.hidden_fields(con) == [("comm", "bucket"), ("span", "stage")]
    assert not V.in_args(V.connect(run.parent / "run"), "mem", ("params",))
    write_analysis(run)
    got = json.loads((run / "analysis.json").read_text())
    assert got["engine"] == "columnar" and got["tables"]["step_rank"]
    assert got["warnings"][0].startswith("records keep comm bucket, span stage in args")
