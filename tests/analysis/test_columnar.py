"""Columnar trace storage and the vectorised tables (issue 19): the JSON-lines Python path is
the oracle; the Parquet files must give the same records, the same tables and the same
analysis."""

from __future__ import annotations

import os

import pytest

from devtools.oracle import analyze_run_dir
from devtools.oracle import collectives as OC
from jobs.analysis import load_run_dir
from jobs.analysis import memory as M
from jobs.analysis import step_sweep as NS
from jobs.analysis import trace_sql as V
from jobs.analysis.storage import columnar, convert
from tests.analysis import synth as s

SPEC = {"preset": "ddp", "parallel": {"dp": 2, "tp": 2}, "model": {"arch": "gpt"},
        "runtime": {"nproc_per_node": 4},
        "train": {"steps": 4}}
KB = 1 << 10


def dp_tp_run(out, steps=4, drop=None, unfinished=None):
    """4 ranks (dp 2 x tp 2): per step a forward with a synchronous TP all-reduce, a backward
    overlapped by two async DP buckets, an optimizer, mem samples; `drop` = (rank, step)
    loses its DP bucket 1 (an incomplete instance), `unfinished` = (rank, step) its step
    span."""
    per = {}
    for rank in range(4):
        coords = {"pp": 0, "dp": rank // 2, "tp": rank % 2}
        recs = [s.meta(rank, 4, coords, SPEC if rank == 0 else None)]
        seq = {"dp": 0, "tp": 0}
        t = 0.0
        recs.append(s.comm(rank, -1, "broadcast", 0, 5, n=2, payload=64 * KB, seq=0,
                           is_root=rank < 2))
        seq["dp"] = 1
        for st in range(steps):
            t0 = t + 10
            jit = 3 * rank + st  # ranks arrive at different times
            recs.append(s.span(rank, st, "forward", t0, t0 + 100 + jit, mb=0))
            recs.append(s.comm(rank, st, "all_reduce", t0 + 40 + jit, t0 + 60 + jit, n=2,
                               payload=16 * KB, group="tp", axis="tp", seq=seq["tp"],
                               region="g", dtype="float32"))
            seq["tp"] += 1
            b0 = t0 + 110 + jit
            recs.append(s.span(rank, st, "backward", b0, b0 + 200, mb=0))
            for b in range(2):
                if drop == (rank, st) and b == 1:
                    seq["dp"] += 1
                    continue
                a = b0 + 50 + 80 * b + rank
                recs.append(s.comm(rank, st, "all_reduce", a, a + 90 + 7 * b, n=2,
                                   payload=256 * KB, seq=seq["dp"], bucket=b, phase="backward",
                                   source="ddp.comm_hook"))
                seq["dp"] += 1
            recs.append(s.span(rank, st, "optimizer", b0 + 260, b0 + 300))
            recs.append(s.mem(rank, st, b0 + 300, params=4 * KB * (1 + rank % 2),
                              grads=4 * KB, optimizer=8 * KB, activations=KB * (st + 1),
                              rss_bytes=1 << 20, note=None, tags=["a", 1]))
            if unfinished != (rank, st):
                recs.append(s.span(rank, st, "step", t0, b0 + 310, cat="step", loss=2.0 - st,
                                   loss_weight=0.5 if rank % 2 == 0 else 0.0))
            t = b0 + 310
        recs.append(s.end(rank, t + 5))
        per[rank] = recs
    s.write(out, per, {"loss": [2.0 - i for i in range(steps)]})
    with open(out / "trace-rank3.jsonl", "a") as f:
        f.write('{"type": "span", "rank": 3, "ts_')  # a torn last line (killed mid-write)
    return out


def test_same_records_and_analysis_through_both_storages(tmp_path):
    run = dp_tp_run(tmp_path / "run", drop=(1, 2))
    tr_json = load_run_dir(run)
    want = analyze_run_dir(run)
    assert not columnar.has_columnar(run)
    written = convert.convert_run_dir(run)
    assert [p.name for p in written] == [f"trace-rank{r}.parquet" for r in range(4)]
    assert columnar.has_columnar(run)
    tr_pq = load_run_dir(run)
    assert tr_pq.ranks == tr_json.ranks
    assert tr_pq.meta == tr_json.meta
    assert tr_pq.warnings == tr_json.warnings
    assert any("unreadable" in w for w in tr_pq.warnings)  # the torn line, counted once
    got = analyze_run_dir(run)
    assert got == want
    assert got["tables"]["collectives"] and not all(
        r["complete"] for r in got["tables"]["collectives"])


def test_vectorised_tables_equal_the_python_ones(tmp_path, monkeypatch):
    monkeypatch.setattr(NS, "CHUNK_RECORDS", 40)  # several step ranges, as a long run has
    run = dp_tp_run(tmp_path / "run", steps=6, drop=(2, 4), unfinished=(1, 5))
    tr = load_run_dir(run)
    convert.convert_run_dir(run)
    con, mt = V.connect(run), V.meta_only(run)
    from jobs.analysis import instances as N
    coll = N.rows_of(list(N.instance_batches(mt, run)), mt)
    assert coll == OC.collectives_table(tr)
    assert any(r["busbw_GBps"] for r in coll)
    assert mt.warnings == [w for w in tr.warnings if "instance" in w]
    assert V.axis_bytes_table(con, mt, run) == OC.axis_bytes_table(tr)
    peaks = V.mem_peaks(con)
    assert {r: (peaks[r], "trace") for r in peaks} == {r: M.measured(tr, r) for r in tr.ranks}


def test_point_to_point_runs_are_covered_by_the_columnar_engine(tmp_path):
    """send / recv runs: the columnar engine applies (it matches transfers too), and the
    Python path over the folder is unchanged by its conversion."""
    per = {}
    for rank in range(2):
        recs = [s.meta(rank, 2, {"pp": rank, "dp": 0, "tp": 0})]
        op = "send" if rank == 0 else "recv"
        for st in range(3):
            t0 = 1000 * st
            recs.append(s.span(rank, st, "forward", t0, t0 + 300, action="F"))
            recs.append(s.comm(rank, st, op, t0 + 300 + 20 * rank, t0 + 350, n=2,
                               payload=8 * KB, group=f"pp:p2p:{st % 2}", axis="pp", seq=st,
                               peer=1 - rank))
            recs.append(s.span(rank, st, "step", t0, t0 + 900, cat="step"))
        recs.append(s.end(rank, 4000))
        per[rank] = recs
    run = s.write(tmp_path / "pp", per)
    want = analyze_run_dir(run)
    convert.convert_run_dir(run)
    from jobs.analysis import engine
    assert not engine.hidden_fields(V.connect(run))  # the engine reads every field it needs
    assert analyze_run_dir(run) == want


def test_old_json_only_run_and_a_stale_conversion_read_the_json_lines(tmp_path):
    run = dp_tp_run(tmp_path / "old")
    want = analyze_run_dir(run)  # a run from before issue 19: JSON lines only
    assert not list(run.glob("*.parquet"))
    assert want["tables"]["step_rank"] and want["headline"]["step_time_s"]
    convert.convert_run_dir(run)
    js = run / "trace-rank0.jsonl"
    st = (run / "trace-rank0.parquet").stat()
    os.utime(js, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # appended after conversion
    assert not columnar.has_columnar(run)
    assert analyze_run_dir(run) == want


def test_parquet_metadata_carries_the_schema_version(tmp_path):
    import pyarrow.parquet as pq
    run = dp_tp_run(tmp_path / "run", steps=1)
    path = convert.convert_run_dir(run)[0]
    md = pq.read_schema(path).metadata
    assert md[columnar.SCHEMA_KEY] == str(columnar.COLUMNAR_SCHEMA).encode()
    cols = pq.read_schema(path).names
    assert cols[0] == "rank" and cols[-1] == "args" and "ts_ns" in cols
    want = load_run_dir(run)
    table = pq.read_table(path)
    pq.write_table(table.replace_schema_metadata(
        {**table.schema.metadata, columnar.SCHEMA_KEY: b"999"}), path)  # a future layout
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    got = load_run_dir(run)  # read through rank 0's JSON lines instead
    assert got.ranks == want.ranks and got.warnings == want.warnings


def test_a_damaged_parquet_file_is_converted_again_from_its_lines(tmp_path):
    """The run's figures still come, from its lines converted again, and the analysis says
    why; equal to the oracle's (the Python tables over the loaded lines)."""
    import json

    from jobs.analysis import write_analysis
    from tests.analysis.test_engine import same
    run = dp_tp_run(tmp_path / "run")
    want = analyze_run_dir(run)
    convert.convert_run_dir(run)
    bad = run / "trace-rank0.parquet"
    st = bad.stat()
    bad.write_bytes(b"PAR1 not a parquet file")
    os.utime(bad, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert "analysis_error" not in write_analysis(run)
    got = json.loads((run / "analysis.json").read_text())
    assert got["engine"] == "columnar"
    assert "Parquet files could not be read" in got["warnings"][0]
    assert "converted again from its JSON lines" in got["warnings"][0]
    assert got["warnings"][1:] == want["warnings"]
    for name in ("step_rank", "collectives", "throughput", "ranks", "axis_bytes"):
        same(got["tables"][name], want["tables"][name], name)
    import pyarrow.parquet as pq
    assert pq.read_metadata(bad).num_rows > 0  # the damaged file replaced


def test_a_failing_engine_is_an_analysis_error_not_a_crash(tmp_path, monkeypatch):
    """No second engine answers: the worker gets the error in the headline (the run still
    finishes), and no analysis.json is left half-written."""
    from jobs.analysis import engine, write_analysis
    run = dp_tp_run(tmp_path / "run")
    convert.convert_run_dir(run)

    def broken(*a, **k):
        raise ZeroDivisionError("planted")
    monkeypatch.setattr(engine, "analyze_columnar", broken)
    assert write_analysis(run) == {"analysis_error": "ZeroDivisionError: planted"}
    assert not (run / "analysis.json").exists()


@pytest.mark.parametrize("chunk", [10**9, 25])
def test_axis_sums_merge_a_missing_axis_with_one_named_question_mark(tmp_path, monkeypatch,
                                                                      chunk):
    """The oracle keys a comm record without an axis as "?": axis_sums.Sums merges it with an
    axis literally named "?" (bytes and distinct steps), fractional bytes summed in order,
    over one step range or many."""
    import json
    monkeypatch.setattr(NS, "CHUNK_RECORDS", chunk)
    run = dp_tp_run(tmp_path / "run", steps=5)
    p = run / "trace-rank0.jsonl"
    out, k = [], 0
    for line in p.read_text().splitlines():
        r = json.loads(line)
        if r.get("type") == "comm" and r.get("axis") == "tp":
            k += 1
            if k % 3 == 0:
                r.pop("axis")
            elif k % 3 == 1:
                r["axis"] = "?"
            r["bytes_sent"] = r.get("bytes_sent", 0) + 0.1 * k  # sums differ by order
        out.append(json.dumps(r))
    p.write_text("\n".join(out) + "\n")
    tr = load_run_dir(run)
    convert.convert_run_dir(run)
    con, mt = V.connect(run), V.meta_only(run)
    want = OC.axis_bytes_table(tr)
    assert any(r["axis"] == "?" and r["rank"] == 0 for r in want)
    assert V.axis_bytes_table(con, mt, run) == want


@pytest.mark.parametrize("preset,want", [(None, "system"), ("system", "system"),
                                         ("mimalloc", "mimalloc")])
def test_the_analysis_takes_the_system_allocator_unless_one_was_chosen(preset, want):
    """columnar.use_system_pool before pyarrow loads: its C++ default is the C library's
    allocator (mimalloc's huge pages cost system time, docs/benchmarks.md); a pool the user
    chose in ARROW_DEFAULT_MEMORY_POOL stays."""
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != columnar.POOL_ENV}
    if preset:
        env[columnar.POOL_ENV] = preset
    code = ("import sys; from jobs.analysis.storage import columnar; assert 'pyarrow' not in "
            "sys.modules; columnar.use_system_pool(); import pyarrow as pa; "
            "print(pa.default_memory_pool().backend_name)")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=root, capture_output=True,
                         text=True, check=True, timeout=120).stdout.split()
    assert out == [want]
