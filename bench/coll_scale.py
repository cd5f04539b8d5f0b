"""The collectives side of the post-run analysis at scale (issue 19), one mode per fresh
process: CPU seconds (every thread), wall seconds and peak RSS.

    .venv/bin/python bench/coll_scale.py new RUN_DIR
    (RUN_DIR written by bench.analysis_speed.make_parquet)

new: instances instances -> bandwidth_links.write_instances, then the four tables over them (the
DuckDB GROUP BY per instance it was measured against, trace_sql.build_instances, is gone:
docs/benchmarks.md keeps its figures).
The step_s input is a stand-in (the max `step` span per step), timed apart and left out.
"""

import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

STEP_S = ("SELECT step, max(dur_ns) / 1e9 FROM t WHERE type = 'span' AND cat = 'step' "
          "GROUP BY step")


def main(mode: str, out: Path) -> None:
    c0, w0 = time.process_time(), time.perf_counter()
    from jobs.analysis import trace_sql as V
    con, tr = V.connect(out), V.meta_only(out)
    path = out / "table-collectives.parquet"
    extra = ""
    if mode == "new":
        import pyarrow as pa

        from jobs.analysis import axis_sums as NA
        from jobs.analysis import bandwidth_links as SC
        from jobs.analysis import engine
        from jobs.analysis import predicted as P
        from jobs.analysis import straggler_sums as SL
        assert not engine.hidden_fields(con)
        n = SC.write_instances(tr, out, path)
        c1 = time.process_time()
        st, ss = zip(*con.execute(STEP_S).fetchall(), strict=True)
        step_s = pa.table({"step": list(st), "step_s": list(ss)})
        c2 = time.process_time()
        late = SL.Lateness.of_file(path)
        strag = SL.stragglers_table(late, step_s)
        ranks = SL.straggler_ranks_table(late, sorted(tr.ranks))
        bw = SC.bandwidth_table(path)
        sp = P.spec_of(tr.spec_dict(), [])
        lk = SC.links_table(con, tr, sp, path, P.theory(sp, []), NA.axis_sums(out))
        c3 = time.process_time()
        extra = (f" instances {c1 - c0:.2f} s, four tables {c3 - c2:.2f} s (rows "
                 f"{strag.num_rows}/{len(ranks)}/{len(bw)}/{len(lk)})")
        cpu = c3 - c0 - (c2 - c1)
    else:
        raise SystemExit(f"mode: 'new' (got {mode!r})")
    recs = con.execute("SELECT count(*) FROM t").fetchone()[0]
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{mode}: {recs} records, {n} instances, CPU {cpu:.2f} s "
          f"({recs / cpu / 1e6:.2f} M rec/CPU-s), wall {time.perf_counter() - w0:.2f} s, "
          f"peak RSS {rss:.0f} MiB;{extra}")


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
