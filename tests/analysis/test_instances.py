"""The collectives side at scale (issue 19): instances's instances and bandwidth_links's tables over
their Parquet file equal the Python oracle's rows (collectives, stragglers, straggler_ranks,
bandwidth, links) on the same run."""

from __future__ import annotations

import json
import math

import pyarrow as pa
import pytest

from devtools.oracle import collectives as OC
from devtools.oracle import links as OL
from devtools.oracle import steps as OS
from devtools.oracle import stragglers as OSG
from jobs.analysis import axis_sums as NA
from jobs.analysis import bandwidth_links as SC
from jobs.analysis import engine, load_run_dir
from jobs.analysis import instances as N
from jobs.analysis import predicted as P
from jobs.analysis import step_sweep as NS
from jobs.analysis import straggler_sums as SL
from jobs.analysis import trace_sql as V
from jobs.analysis.storage import convert
from tests.analysis import synth as s
from tests.analysis.test_columnar import dp_tp_run

KB = 1 << 10
MOE = {"arch": "gpt", "layers": 2, "hidden": 16, "heads": 2, "seq_len": 8, "vocab": 32,
       "experts": 4, "top_k": 2}
EP_SPEC = {"model": MOE, "parallel": {"dp": 4, "ep": 2}, "train": {"steps": 3, "global_batch": 8},
           "runtime": {"nnodes": 2, "nproc_per_node": 2}}


def ep_run(out, steps=3):
    """4 ranks, dp 4 with ep 2 (two hosts of 2): per step an all-to-all in each `ep` group
    (dp // 2), an `edp` all-reduce (dp % 2) and a dp all-reduce over all four, ranks
    arriving at staggered times; rank 3 misses its last step's edp op."""
    per = {}
    for rank in range(4):
        recs = [s.meta(rank, 4, {"pp": 0, "dp": rank, "tp": 0}, EP_SPEC if rank == 0 else None)]
        for st in range(steps):
            t0 = 1000 * st
            recs.append(s.span(rank, st, "forward", t0, t0 + 400))
            a = t0 + 50 + 7 * rank + 3 * st
            recs.append(s.comm(rank, st, "all_to_all", a, a + 30, n=2, payload=8 * KB,
                               group="ep", axis="ep", seq=st))
            if (rank, st) != (3, steps - 1):
                b = t0 + 150 + 5 * ((rank + st) % 3)
                recs.append(s.comm(rank, st, "all_reduce", b, b + 40, n=2, payload=32 * KB,
                                   group="edp", axis="edp", seq=st))
            c = t0 + 250 + 11 * ((rank * 3 + st) % 4)
            recs.append(s.comm(rank, st, "all_reduce", c, c + 60, n=4, payload=64 * KB,
                               seq=st, bucket=0))
            recs.append(s.span(rank, st, "step", t0, t0 + 900, cat="step"))
        recs.append(s.end(rank, 1000 * steps))
        per[rank] = recs
    return s.write(out, per)


VARIANTS = {"plain": {}, "drop": {"drop": (1, 2)}, "unfinished": {"unfinished": (2, 3)},
            "both": {"drop": (2, 4), "unfinished": (1, 5), "steps": 6}}


def _run(tmp_path, kind):
    run = ep_run(tmp_path / "ep") if kind == "ep" else \
        dp_tp_run(tmp_path / "run", **VARIANTS[kind])
    tr = load_run_dir(run)
    convert.convert_run_dir(run)
    return run, tr


def close(a, b) -> bool:
    """Equal, floats to 1e-9 relative (sums in another order)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15)
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("kind", [*VARIANTS, "ep"])
@pytest.mark.parametrize("chunk", [10**9, 40, 7])
def test_instances_equal_the_oracle(tmp_path, monkeypatch, kind, chunk):
    monkeypatch.setattr(NS, "CHUNK_RECORDS", chunk)  # one pass, several, one per step
    run, tr = _run(tmp_path, kind)
    want = OC.collectives_table(tr)
    con, mt = V.connect(run), V.meta_only(run)
    assert not engine.hidden_fields(con)
    batches = list(N.instance_batches(mt, run))
    assert len(batches) > (2 if chunk == 7 else 0)
    got = N.rows_of(batches, mt)
    assert got == want  # exact: the same integer ns and the same float formulas
    assert mt.warnings == [w for w in tr.warnings if "instance" in w]
    assert any(r["busbw_GBps"] for r in got) and any("bucket" in r for r in got)
    if kind in ("drop", "both", "ep"):
        assert not all(r["complete"] for r in got)


def test_an_instance_across_a_pass_boundary_stays_whole(tmp_path, monkeypatch):
    """An op whose ranks disagree on the step (one says 2, one 3) and a setup op seen at
    step 0 on one rank (and without its `group` on two): carried into the next pass, not
    split."""
    monkeypatch.setattr(NS, "CHUNK_RECORDS", 7)
    run = dp_tp_run(tmp_path / "run", steps=5)
    for rank, shift in ((0, {2: 3}), (1, {-1: 0})):
        p = run / f"trace-rank{rank}.jsonl"
        lines = p.read_text().splitlines(keepends=True)
        out = []
        for ln in lines:
            try:
                r = json.loads(ln)
            except ValueError:
                out.append(ln)
                continue
            if r.get("type") == "comm" and r.get("axis") == "tp" and r["step"] in shift:
                r["step"] = shift[r["step"]]
            elif r.get("type") == "comm" and r.get("op") == "broadcast":
                r.pop("group")  # matched by its axis, with the other ranks' "dp"
                r["step"] = shift.get(-1, -1)
            out.append(json.dumps(r) + "\n")
        p.write_text("".join(out))
    tr = load_run_dir(run)
    convert.convert_run_dir(run)
    mt = V.meta_only(run)
    assert N.rows_of(list(N.instance_batches(mt, run)), mt) == OC.collectives_table(tr)
    assert not mt.warnings


def test_point_to_point_is_for_numpy_too(tmp_path):
    per = {r: [s.meta(r, 2), s.comm(r, 0, "send" if r == 0 else "recv", 10, 20, n=2,
                                     payload=KB, group="pp", axis="pp", peer=1 - r)]
           for r in range(2)}
    run = s.write(tmp_path / "pp", per)
    convert.convert_run_dir(run)
    # sends and receives are matched by the columnar engine as well (scale_pipeline's tests
    # check the matching by hand), every field it reads in its column
    assert not engine.hidden_fields(V.connect(run))


@pytest.mark.parametrize("kind", [*VARIANTS, "ep"])
def test_tables_over_the_instances_file_equal_the_oracle(tmp_path, monkeypatch, kind):
    monkeypatch.setattr(NS, "CHUNK_RECORDS", 40)
    run, tr = _run(tmp_path, kind)
    coll, step_rows = OC.collectives_table(tr), OS.step_rank_table(tr)
    con, mt = V.connect(run), V.meta_only(run)
    path = tmp_path / "table-collectives.parquet"
    assert SC.write_instances(mt, run, path) == len(coll)
    assert mt.warnings == [w for w in tr.warnings if "instance" in w]
    steps = sorted({r["step"] for r in step_rows})
    step_s = pa.table({"step": steps, "step_s": [max(r["step_s"] for r in step_rows
                                                     if r["step"] == st) for st in steps]})
    late = SL.Lateness.of_file(path)  # the sums InstanceWriter keeps, from the file
    strag = SL.straggler_rows(SL.stragglers_table(late, step_s))
    want = OSG.stragglers_table(coll, step_rows)
    assert close(strag, want) and want
    assert close(SL.straggler_ranks_table(late, {r["rank"] for r in step_rows}),
                 OSG.straggler_ranks_table(coll, step_rows))
    bw = SC.bandwidth_table(path)
    assert bw == OC.bandwidth_table(coll) and bw  # medians to the last bit (np.median)
    sp = P.spec_of(tr.spec_dict(), [])
    pred = P.theory(sp, [])
    lk = SC.links_table(con, mt, sp, path, pred, NA.axis_sums(run))
    assert close(lk, OL.links_table(tr, sp, coll, pred)) and lk
    if kind == "ep":
        assert {r["link"] for r in lk} == {"intra", "inter"}


def test_a_flagged_straggler_and_an_even_median(tmp_path):
    """Rank 1 arrives 50 µs late at every tp op: flagged in the oracle and here; the
    bandwidth medians of an even number of instances are the mean of the middle two."""
    run, tr = _run(tmp_path, "plain")
    coll = OC.collectives_table(tr)
    path = tmp_path / "c.parquet"
    SC.write_instances(V.meta_only(run), run, path)
    tiny = pa.table({"step": [0, 1, 2, 3], "step_s": [1e-4] * 4})
    got = SL.straggler_rows(SL.stragglers_table(SL.Lateness.of_file(path), tiny))
    rows = [{"step": st, "rank": 0, "step_s": 1e-4} for st in range(4)]
    assert close(got, OSG.stragglers_table(coll, rows)) and any(r["flagged"] for r in got)
    assert any(r["instances"] % 2 == 0 for r in SC.bandwidth_table(path))


def test_the_packed_sort_and_its_fallback_agree():
    import numpy as np
    rng = np.random.default_rng(0)
    grp, sc, rank = (rng.integers(0, 4, 500) for _ in range(3))
    row = rng.permutation(500)  # (rank, row) names one record
    want = np.lexsort((row, rank, sc, grp))
    assert (N._order(grp, sc, rank, row) == want).all()  # packed: 13 bits
    assert (N._order(grp, sc << 40, rank, row << 30) == want).all()  # 75 bits: lexsort
