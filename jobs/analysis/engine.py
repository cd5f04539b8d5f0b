"""The columnar engine: the whole analysis of a run, whatever its size or layout, without
loading its records into Python (run.analyze_folder converts a folder of JSON lines first).

Every table, computed over the run's Parquet files: the
per-record-scale tables (step_rank, collectives) by numpy over one step range at a time
(step_sweep.py, instances.py), the per-step and per-rank tables from them by SQL (step_tables.py,
bandwidth_links.py), the small ones (axis_bytes, memory peaks) by trace_sql.py, the loader's
warnings from the files' metadata. Records only MoE tables read (`moe`, all-to-all) are
loaded into a sparse Traces for their Python functions. The result is assembled by
assemble.py. A finished run, a running run's partial figures (the backend's scratch
conversion of its shipped lines, backend/services/run_traces.py) and a lost worker's run
are all analysed here; the Python tables over load.py's Traces (oracle.analyze) are the
tests' oracle (tests/analysis/test_engine.py: equal analyses).

Tables of more than JSON_ROWS rows stay whole in `table-<name>.parquet` beside the traces;
analysis.json keeps an even sample of them (every k-th row) and says so in `table_files`
(`table_rows` pages the file: the API's `?table=`, the CSV export).

A pipeline run's bubble figures come from its action spans by DuckDB and numpy (pipeline_spans.py)
into the step_rank rows, and its stage_bubbles from pipeline.py's own function over them; its
point-to-point ops are matched as oracle.collectives.match matches them (instances).
"""

from __future__ import annotations

import json
from pathlib import Path

from . import assemble as A
from . import axis_sums as NA
from . import links as LK
from . import memory as M
from . import moe as MOE
from . import pipeline as PL
from . import predicted as P
from . import step_sweep as NS
from . import trace_sql as V
from .storage import columnar
from .storage.jsonl import sort_key
from .storage.load import Traces, finish, rank_warnings

JSON_ROWS = 5_000  # rows of one table analysis.json holds; a larger table keeps a sample
MEMORY_LIMIT = "1GB"  # DuckDB spills beyond it (peak RSS stays bounded)
FILE = "table-{}.parquet"


def _quoted(xs) -> str:
    return ", ".join(f"'{x}'" for x in xs)


# the records only the MoE tables (expert_load, all_to_all) read, as SQL: axis_sums's RARE_TYPES
# and RARE_OPS, the one definition its read checks for
RARE = (f"type IN ({_quoted(NA.RARE_TYPES)}) OR "
        f"(type = 'comm' AND op IN ({_quoted(NA.RARE_OPS)}))")
BIG = ("step_rank", "collectives", "throughput", "stragglers")  # rows per step or instance


def record_count(out_dir: Path) -> int:
    """Records in the run's Parquet files, from their footers (no scan)."""
    import pyarrow.parquet as pq
    return sum(pq.read_metadata(p).num_rows
               for p in Path(out_dir).glob("trace-rank*" + columnar.SUFFIX))


# what a pipeline's tables read of its action spans besides step_sweep.FIELDS (a span's
# `chunk` is read from args where it has no `stage`)
PIPE_FIELDS = ("action", "stage")


def hidden_fields(con) -> list[tuple[str, str]]:
    """(record type, field) of the fields a table reads that some record keeps in its args
    (a value of another type than its column, columnar.to_columns): SQL reads those records
    without them, and the analysis says so (run.analyze_folder)."""
    keys = V.args_keys(con)
    read = [("span", f) for f in NS.FIELDS + PIPE_FIELDS] + \
        [("comm", f) for f in NS.FIELDS + V.COMM_FIELDS + ("peer",)]
    return sorted({k for k in read if k in keys})


def meta_traces(out_dir: Path, con) -> Traces:
    """The run's Traces without records: meta per rank, summary.json, and the loader's
    warnings (load.rank_warnings from each file's parse state and its `end` reasons)."""
    import pyarrow.parquet as pq
    tr = Traces()
    ends: dict[int, list] = {r: list(v) for r, v in con.execute(
        "SELECT rank, list(reason ORDER BY row) FROM t WHERE type = 'end' GROUP BY rank"
    ).fetchall()}
    has_rows = {r for (r,) in con.execute("SELECT DISTINCT rank FROM t").fetchall()}
    paths = sorted(Path(out_dir).glob("trace-rank*" + columnar.SUFFIX))
    if not paths:  # (the loader's words: a folder of neither kind of file)
        tr.warnings.append(f"no trace-rank*.jsonl files in {Path(out_dir).name or out_dir}")
    for path in paths:
        m = V._RANK_RE.search(path.name)
        if not m:
            continue
        rank = int(m.group(1))
        md = pq.read_schema(path).metadata or {}
        meta = json.loads(md.get(columnar.META_KEY, b"{}"))
        state = json.loads(md.get(columnar.STATE_KEY, b"{}"))
        rank_warnings(rank, meta, int(state.get("bad", 0)), bool(state.get("empty")),
                      ends.get(rank, []), tr.warnings)
        if rank in has_rows or meta:
            tr.ranks[rank], tr.meta[rank] = [], meta
    return finish(tr, out_dir)


def sparse(con, base: Traces, where: str | None) -> Traces:
    """`base` (meta, summary, warnings shared) with the records matching the SQL condition
    `where` only (None: no record), in the loader's order: what the Python functions of rare
    records read."""
    tr = Traces(ranks={r: [] for r in base.ranks}, meta=base.meta, warnings=base.warnings,
                summary=base.summary)
    if where is None:
        return tr
    table = con.sql(f"SELECT * EXCLUDE (row) FROM t WHERE {where} ORDER BY rank, row"
                    ).to_arrow_table()
    for rec in columnar.records_of(table):
        tr.ranks.setdefault(rec["rank"], []).append(rec)
    for recs in tr.ranks.values():
        recs.sort(key=sort_key)
    return tr


def stride_of(n: int) -> int:
    """The sample's stride of a table of n rows: the smallest power of two leaving at most
    JSON_ROWS rows (every k-th row, from the first). A power of two so that a sample taken
    while the rows stream (Sampler: their count unknown until the end) is this one."""
    k = 1
    while -(-n // k) > JSON_ROWS:
        k *= 2
    return k


class Sampler:
    """The rows of index 0, k, 2k, ... of a table fed batch by batch in file order, k =
    stride_of(rows fed so far): as k grows (powers of two) the kept rows are thinned to its
    multiples, so at most JSON_ROWS rows are held, never the table."""

    def __init__(self):
        self.k, self.n, self.parts = 1, 0, []

    def add(self, batch) -> None:
        import numpy as np
        import pyarrow as pa
        k = stride_of(self.n + batch.num_rows)  # k only grows: thin what is kept to it
        if k > self.k and self.parts:
            kept = pa.concat_tables(self.parts)  # kept row i holds index i * self.k
            self.parts = [kept.take(pa.array(np.arange(0, kept.num_rows, k // self.k)))]
        self.k = k
        first = (-self.n) % k  # the batch's first row whose index is a multiple of k
        self.parts.append(batch.take(pa.array(np.arange(first, batch.num_rows, k))))
        self.n += batch.num_rows

    def result(self):
        """(the sample as one table, its stride)."""
        import pyarrow as pa
        assert self.k == stride_of(self.n)
        return pa.concat_tables(self.parts), self.k


def _steady_mask(steps):
    """Which entries are steady steps (rules.steady over the distinct steps)."""
    import numpy as np

    from . import rules
    keep = np.asarray(rules.steady(np.unique(steps).tolist()), dtype=np.int64)
    return np.isin(steps, keep)


def step_aggregates(sr, thr, strag) -> dict:
    """The headline's figures over the per-step tables as Arrow tables or None (step_rank
    in (rank, step) order, throughput and stragglers by step): means over the steady steps,
    sums in row order (the oracle's oracle.step_aggregates: equal to the last bit)."""
    import numpy as np

    from . import rules
    from . import stragglers as SG
    from .step_tables import _col, _seq_sum
    step = _col(sr, "step", np.int64)
    use = _steady_mask(step)
    comm = _seq_sum(_col(sr, "comm_s")[use])
    means = {}
    for k in A.STEP_MEANS:
        v = _col(sr, f"{k}_s")[use]
        v = v[~np.isnan(v)]
        means[f"{k}_s"] = _seq_sum(v) / len(v) if len(v) else None
    t_step, t_s = _col(thr, "step", np.int64), _col(thr, "step_s")
    has = ~np.isnan(t_s)
    vals = t_s[_steady_mask(t_step) & has]
    tokens = next((x for x in thr.column("tokens").drop_null().to_pylist() if x), None) \
        if thr is not None else None
    losses = thr.column("loss").drop_null() if thr is not None else []
    s_use = _steady_mask(_col(strag, "step", np.int64))
    flagged: dict[int, list[float]] = {}
    if strag is not None:
        f = strag.filter(s_use & _col(strag, "flagged", bool))
        for rank, wait in zip(f.column("rank").to_pylist(),
                              f.column("caused_wait_s").to_pylist(), strict=True):
            flagged.setdefault(rank, []).append(wait)
    return {"steady_steps": rules.steady_range(t_step[has].tolist()),
            "step_time_s": float(np.median(vals)) if len(vals) else None,
            "tokens": tokens,
            "overlap_pct": 100.0 * _seq_sum(_col(sr, "overlap_s")[use]) / comm
            if comm else None,
            **means,
            "final_loss": losses[-1].as_py() if len(losses) else None,
            "steps": len(t_step), "ranks": len(np.unique(_col(sr, "rank", np.int64))),
            "straggler": SG.straggler_of_flags(flagged, int(s_use.sum()))}


def table_files(out_dir: Path, sizes: dict[str, int], strides: dict[str, int]) -> dict:
    """analysis.json's `table_files`: per table kept whole in Parquet, its file, its rows and
    the sample analysis.json holds (every `stride`-th row)."""
    return {name: {"file": FILE.format(name), "rows": n, "stride": strides[name],
                   "json_rows": -(-n // strides[name])}
            for name, n in sizes.items() if strides.get(name, 1) > 1}


def table_rows(out_dir: Path, name: str, offset: int = 0,
               limit: int | None = None) -> tuple[int, list[dict]]:
    """(rows in all, rows[offset:offset + limit]) of a table kept in `table-<name>.parquet`:
    what the API pages and the CSV export writes, the same dicts analysis.json holds."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    pf = pq.ParquetFile(Path(out_dir) / FILE.format(name))
    total = pf.metadata.num_rows
    end = total if limit is None else min(total, offset + limit)
    parts, at = [], 0  # read row groups up to the slice's end, keep its rows only
    for i in range(pf.metadata.num_row_groups):
        n = pf.metadata.row_group(i).num_rows
        if at + n > offset and at < end:
            g = pf.read_row_group(i)
            parts.append(g.slice(max(0, offset - at), end - max(offset, at)))
        at += n
        if at >= end:
            break
    part = pa.concat_tables(parts) if parts else pf.schema_arrow.empty_table()
    return total, ROWS[name](part, V.meta_only(Path(out_dir)))


def iter_table_rows(out_dir: Path, name: str):
    """Every row of a table kept in `table-<name>.parquet`, one list of dicts per row group
    (table_rows' dicts, in file order): what the whole-table CSV / JSON downloads stream."""
    import pyarrow.parquet as pq
    pf = pq.ParquetFile(Path(out_dir) / FILE.format(name))
    meta = V.meta_only(Path(out_dir))
    for i in range(pf.metadata.num_row_groups):
        yield ROWS[name](pf.read_row_group(i), meta)


def table_header(out_dir: Path, name: str) -> list[str]:
    """rows_to_csv's header of the whole table without its rows in memory: the first row's
    keys, then the optional keys a later row brings, by the first row holding each (ties in
    the row's key order). Only the collectives' rows omit keys (NC.OPTIONAL when null)."""
    import numpy as np
    import pyarrow.parquet as pq

    from . import instances as NC
    pf = pq.ParquetFile(Path(out_dir) / FILE.format(name))
    if not pf.metadata.num_rows:
        return []
    first = ROWS[name](pf.read_row_group(0).slice(0, 1), V.meta_only(Path(out_dir)))[0]
    cols = list(first)
    if name != "collectives":
        return cols
    seen, at = {}, 0  # optional key -> the first row holding it
    for i in range(pf.metadata.num_row_groups):
        todo = [k for k in NC.OPTIONAL if k not in cols and k not in seen]
        if not todo:
            break
        g = pf.read_row_group(i, columns=todo)
        for k in todo:
            valid = np.asarray(g.column(k).is_valid())
            if valid.any():
                seen[k] = at + int(valid.argmax())
        at += g.num_rows
    return cols + sorted(seen, key=lambda k: (seen[k], NC.OPTIONAL.index(k)))


def _arrow(path: Path):
    import pyarrow.parquet as pq
    return pq.read_table(path)


def analyze_columnar(out_dir: Path, spec=None, con=None, live=None) -> dict:
    """oracle.analyze's result over a converted run's Parquet files (see the module doc), plus
    `table_files`; the large tables' Parquet files are left in `out_dir`. `con`: a
    trace_sql.connect connection (else one with MEMORY_LIMIT). `live`: the worker's
    analyze_live.LiveAnalysis of this run, whose passes are not read again where it is
    whole (LiveAnalysis.resume; else it is discarded and every pass is read)."""
    from . import bandwidth_links as SC
    from . import one_read as SR
    from . import pipeline_spans as SP
    from . import step_tables as SS
    from . import straggler_sums as SL
    out_dir = Path(out_dir)
    con = con if con is not None else V.connect(out_dir, MEMORY_LIMIT)
    tr = meta_traces(out_dir, con)
    w = tr.warnings
    sp = P.spec_of(spec if spec is not None else tr.spec_dict(), w)
    spec_dict = sp.to_dict() if sp is not None else tr.spec_dict()
    pred = A.safe(w, "theory", lambda: P.theory(sp, w), None)
    path = {n: out_dir / FILE.format(n) for n in BIG}
    sizes: dict[str, int] = {}
    t: dict = {}
    hosts = LK.rank_hosts(tr, sp)[0]  # what the instances' links are taken with
    resume = live.resume(out_dir, tr, path, hosts) if live is not None else None
    # analysis.json's rows of the collectives, taken as they stream
    coll_sample = resume.sampler if resume is not None else Sampler()
    sr, sizes["collectives"], axis, late = SR.one_read(
        tr, out_dir, path, coll_sample, resume, hosts, lambda c: SP.figures(con, tr, c, out_dir))
    columnar.release_memory()  # what the read freed, before the tables over its results
    sizes["step_rank"] = sr.num_rows if sr is not None else 0
    # the two tables over the instance file: its value columns read once for both
    inst = SC.Instances(path["collectives"], late.steps)
    t["ranks"] = A.safe(w, "ranks", lambda: SS.ranks_table(sr, tr), [])
    step_s = A.safe(w, "step times", lambda: SS.step_times(sr), None)
    sizes["stragglers"] = A.safe(w, "stragglers", lambda: _write(SL.stragglers_table(
        late, step_s), path["stragglers"]), 0)
    t["straggler_ranks"] = A.safe(w, "straggler_ranks", lambda: SL.straggler_ranks_table(
        late, _ranks_of(sr)), [])
    t["bandwidth"] = A.safe(w, "bandwidth", lambda: SC.bandwidth_table(inst),
                            [])
    sums = A.safe(w, "axis_bytes", axis, None)
    t["axis_bytes"] = A.safe(w, "axis_bytes", lambda: V.axis_bytes_table(
        con, tr, out_dir, sums), []) if sums is not None else []
    A.safe(w, "axis_bytes predictions",
           lambda: A.axis_predictions(t["axis_bytes"], pred, tr.summary), None)
    t["links"] = A.safe(w, "links", lambda: SC.links_table(
        con, tr, sp, inst, pred, sums), []) if sums is not None else []
    t["placement"] = A.safe(w, "placement", lambda: LK.placement_table(tr, sp), [])
    # the records only MoE tables read; none (no scan) where axis_sums saw none
    rare = sparse(con, tr, RARE if sums is None or sums["rare"] else None)
    peaks = A.safe(w, "memory peaks", lambda: V.mem_peaks(con), None)
    mem_tr = rare if peaks is not None else sparse(con, tr, "type IN ('mem', 'moe')")
    t["memory"] = A.safe(w, "memory", lambda: M.memory_table(mem_tr, sp, pred, peaks), [])
    t["stage_bubbles"] = A.safe(w, "stage_bubbles", lambda: PL.stage_bubbles_table(
        tr, sp, P.pipeline(pred), _pipe_rows(sr, tr), lambda steps: SP.stage_sums(con, steps)),
        [])
    t["expert_load"] = A.safe(w, "expert_load", lambda: MOE.expert_load_table(rare), [])
    t["all_to_all"] = A.safe(w, "all_to_all", lambda: MOE.all_to_all_table(rare), [])
    sizes["throughput"] = A.safe(w, "throughput", lambda: SS.write_throughput(
        con, sr, spec_dict, tr.summary, path["throughput"], w), 0)
    trace = A.safe(w, "trace coverage", lambda: SS.trace_coverage(con, sr), {})
    pp = sp.parallel.pp if sp is not None else 1
    strides: dict[str, int] = {}
    big = {n: _arrow(path[n]) if sizes.get(n) else None for n in BIG if n != "collectives"}
    big["step_rank"] = sr
    for name in BIG:
        t[name], strides[name] = _json_rows(
            name, coll_sample if name == "collectives" else big[name], sizes.get(name), tr)
    agg = A.safe(w, "headline", lambda: step_aggregates(
        big["step_rank"], big["throughput"], big["stragglers"]), None)
    headline = A.safe(w, "headline", lambda: A.headline(t, agg, pred, pp, spec_dict), {}) \
        if agg is not None else {}
    for name in BIG:  # a table analysis.json holds whole needs no file
        if strides[name] == 1:
            path[name].unlink(missing_ok=True)
    return A.result(tr, sp, spec_dict, t, headline, trace, engine="columnar",
                    table_files=table_files(out_dir, sizes, strides))


def _pipe_rows(sr, tr: Traces) -> list[dict]:
    """The step_rank rows with a pipeline window, with what stage_bubbles_table reads of
    them (rows without one it skips)."""
    if sr is None:
        return []
    import pyarrow.compute as pc
    part = sr.select(["step", "rank", "pipeline_window_s", "pipeline_idle_s"]).filter(
        pc.is_valid(sr.column("pipeline_window_s")))
    rows = [x for x in part.to_pylist() if x["pipeline_window_s"]]  # as pipe_rows there
    for x in rows:
        x["pp"] = tr.coords(x["rank"]).get("pp")
    return rows


def _write(table, path: Path) -> int:
    """An Arrow table to `path` (Parquet); its rows."""
    import pyarrow.parquet as pq
    pq.write_table(table, path)
    return table.num_rows


def _ranks_of(sr) -> list[int]:
    import numpy as np

    from .step_tables import _col
    return np.unique(_col(sr, "rank", np.int64)).tolist()


def _coll_rows(table, tr: Traces) -> list[dict]:
    """collectives_table's dicts of instance rows (optional keys omitted when null)."""
    from . import instances as NC
    rows = table.select(list(NC.ROW_KEYS + NC.OPTIONAL)).to_pylist()
    for x in rows:
        for k in NC.OPTIONAL:
            if x[k] is None:
                del x[k]
    return rows


def _strag_rows(table, tr: Traces) -> list[dict]:
    from . import straggler_sums as SL
    return SL.straggler_rows(table)


def _json_rows(name: str, table, n: int | None, tr: Traces) -> tuple[list[dict], int]:
    """analysis.json's rows of a large table: all of them, or every k-th (stride_of). `table`:
    the whole table in memory, or for the collectives the Sampler their batches fed."""
    if not n:
        return [], 1
    if isinstance(table, Sampler):
        part, stride = table.result()
        assert table.n == n, (table.n, n)
    else:
        import numpy as np
        import pyarrow as pa
        stride = stride_of(n)
        part = table.take(pa.array(np.arange(0, n, stride))) if stride > 1 else table
    if name == "collectives":  # the file is in step-range order: the oracle's within JSON
        from . import instances as NC
        part = part.take(NC.sort_indices(part))
    return ROWS[name](part, tr), stride


def _rows_step_rank(table, tr):
    from . import step_tables as SS
    return SS.step_rank_rows(table, tr)


def _rows_throughput(table, tr):
    return table.to_pylist()


# table -> (its Arrow rows, the run's meta Traces) -> the rows' dicts
ROWS = {"step_rank": _rows_step_rank, "collectives": _coll_rows,
        "throughput": _rows_throughput, "stragglers": _strag_rows}
