"""The tables built on the collectives at scale (issue 19), from the instances' Parquet file
(np_coll.instance_batches, written by InstanceWriter), in numpy:

    bandwidth_table         collectives.bandwidth_table
    links_table             links.links_table                (+ per-record bytes from np_axis)

(the straggler tables are summed as the instances are written: scale_late.py). Definitions
stay where they are: steady steps are rules.steady, an instance's link links.link_of of its
ranks' hosts (links.rank_hosts). Medians are statistics.median's to the last bit (np.median
of a group's values: the middle one, or the mean of the middle two); a DuckDB query did these
tables before (median: lo + (hi - lo) / 2, 1 ulp off) at about three times the CPU.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from . import links as LK
from . import np_coll as N
from . import rules
from .load import Traces

NS = 1e9
# strings as dictionaries, statistics on `step` (what the readers filter on): the floats'
# dictionaries and statistics are write time spent for nothing
WRITE = {"compression": "snappy", "use_dictionary": ["op", "axis", "group", "backend_op",
                                                      "phase"], "write_statistics": ["step"]}


class InstanceWriter:
    """The instances' file written batch by batch (one row group per batch, each in the
    oracle's order: the file is by step range, then as collectives_table orders); `sample`:
    called with each batch as written (the scale path's Sampler of analysis.json's rows)."""

    def __init__(self, path: Path, sample=None):
        from .scale_late import Lateness
        self.path, self.sample = Path(path), sample
        self.writer, self.n, self.incomplete = None, 0, 0
        self.late = Lateness()  # what the straggler tables read of the instances

    def write(self, b: pa.Table) -> None:
        if self.writer is None:
            self.writer = pq.ParquetWriter(self.path, b.schema, **WRITE)
        b = b.take(N.sort_indices(b)).cast(self.writer.schema)
        self.writer.write_table(b)
        self.late.add(b)
        if self.sample is not None:
            self.sample(b)
        self.n += b.num_rows
        self.incomplete += b.num_rows - pc.sum(b["complete"]).as_py()

    def close(self, tr: Traces | None = None) -> int:
        """The file closed (none written without an instance); the count. `tr`: where
        collectives_table's incomplete-instances warning goes."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        if tr is not None:
            N.warn_incomplete(tr, self.incomplete)
        return self.n


def write_instances(tr: Traces, out_dir: Path, path: Path, sample=None,
                    passes=None) -> int:
    """np_coll.instance_batches of the run in `out_dir` (`passes`: its comm records per pass,
    when read already) streamed to `path` (InstanceWriter); the count. Appends
    collectives_table's incomplete-instances warning to tr.warnings. No file is written when
    there is no instance. Call only where np_coll.applies."""
    out = InstanceWriter(path, sample)
    try:
        for b in N.instance_batches(tr, out_dir, passes):
            out.write(b)
    except BaseException:
        out.close()  # what was written stays readable; the caller removes it
        raise
    return out.close(tr)


class Instances:
    """The instances' file and what the two tables read of it, decoded once (on first use)
    and shared: of the steady steps' complete instances with a busbw (the oracle's filter),
    their (op, axis, payload, group size) group, their axis and the hosts their ranks span,
    and per value column (`values`) the values in group order."""

    SHARED = ("duration_s", "busbw_GBps")  # both tables read them: kept once read

    def __init__(self, path: Path):
        self.path = Path(path)
        self._keys = None
        self._vals: dict[str, np.ndarray] = {}

    def exists(self) -> bool:
        return self.path.exists()

    def keys(self) -> dict:
        """{"bw": (group codes, group tuples), "axis": (codes, names), "order": the kept
        rows' file order of the chosen rows, "mask": which rows are kept, "ranks": (offsets,
        values) of the kept rows' rank lists}."""
        if self._keys is None:
            t = pq.read_table(self.path, columns=["step", "complete", "busbw_GBps", "op", "axis",
                                                  "payload_bytes", "group_size", "ranks"],
                              read_dictionary=["op", "axis"])
            step = _ints(t["step"], -1)
            steps = pc.unique(pa.array(step[step >= 0])).to_pylist()
            use = np.asarray(rules.steady(steps), np.int64)
            m = np.isin(step, use) & np.asarray(pc.fill_null(t["complete"], False)) & \
                np.asarray(t["busbw_GBps"].is_valid())
            op, ops = _dict_codes(t["op"], "None")
            ax, axes = _dict_codes(t["axis"], "None")
            op, ax = op[m], ax[m]
            pay, pays = _factorize(_ints(t["payload_bytes"], 0)[m])
            gs, gss = _factorize(_ints(t["group_size"], 0)[m])
            code, combo = _factorize(((op * len(axes) + ax) * len(pays) + pay) * len(gss) + gs)
            groups = []
            for c in combo.tolist():
                c, g = divmod(c, len(gss))
                c, y = divmod(c, len(pays))
                o, a = divmod(c, len(axes))
                groups.append((ops[o], axes[a], int(pays[y]), int(gss[g])))
            ranks = t["ranks"].combine_chunks().filter(pa.array(m))
            self._keys = {"bw": (code, groups), "axis": (ax, axes), "mask": m,
                          "ranks": (np.asarray(ranks.offsets), np.asarray(
                              ranks.values.to_numpy(zero_copy_only=False), np.int64))}
        return self._keys

    def values(self, name: str) -> np.ndarray:
        """A float column's values of the kept rows, in file order."""
        if name in self._vals:
            return self._vals[name]
        col = pq.read_table(self.path, columns=[name])[name]
        v = np.asarray(pc.fill_null(col, np.nan).to_numpy(zero_copy_only=False),
                       np.float64)[self.keys()["mask"]]
        if name in self.SHARED:
            self._vals[name] = v
        return v


def _factorize(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(codes, distinct values) of an int array, by hashing (a sort of millions of
    instances cost seconds): codes index the values in order of first appearance."""
    d = pc.dictionary_encode(pa.array(x, pa.int64()))
    return (np.asarray(d.indices.to_numpy(zero_copy_only=False), np.int64),
            np.asarray(d.dictionary.to_numpy(zero_copy_only=False), np.int64))


def _ints(col, fill) -> np.ndarray:
    return np.asarray(pc.fill_null(col, fill).to_numpy(zero_copy_only=False)).astype(np.int64)


def _dict_codes(col, null: str) -> tuple[np.ndarray, list[str]]:
    """A dictionary column's codes over its values as str() reads them (null: `null`)."""
    col = col.combine_chunks()
    names = [*(str(x) for x in col.dictionary.to_pylist()), null]
    codes = np.asarray(col.indices.fill_null(len(names) - 1).to_numpy(zero_copy_only=False),
                       np.int64)
    uniq = sorted(set(names))  # merge equal strings (a null and a "None"), codes by order
    lut = np.array([uniq.index(x) for x in names], np.int64)
    return lut[codes], uniq


def _medians(code: np.ndarray, n: int, cols: dict[str, np.ndarray]) -> dict[str, list]:
    """Per group 0..n-1 of `code`: statistics.median of each column's values (np.median:
    the mean of the two middle values for an even count, as statistics.median), and `min`
    of the columns named `min:<column>`."""
    # a radix sort where the codes fit 16 bits (numpy's stable sort of small ints)
    order = np.argsort(code.astype(np.uint16) if n <= 1 << 16 else code, kind="stable")
    bounds = np.searchsorted(code[order], np.arange(n + 1))
    out: dict[str, list] = {}
    for name, v in cols.items():
        f = np.min if name.startswith("min:") else np.median
        v = v[order]
        out[name] = [float(f(v[a:b])) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    return out


def bandwidth_table(coll) -> list[dict]:
    """collectives.bandwidth_table. `coll`: an Instances or the file's path."""
    coll = coll if isinstance(coll, Instances) else Instances(coll)
    if not coll.exists():
        return []
    code, groups = coll.keys()["bw"]
    if not len(groups):
        return []
    dur = coll.values("duration_s")
    med = _medians(code, len(groups), {"duration_s": dur, "min:duration_s": dur,
                                       "wait_s": coll.values("wait_s"),
                                       "algbw_GBps": coll.values("algbw_GBps"),
                                       "busbw_GBps": coll.values("busbw_GBps")})
    count = np.bincount(code, minlength=len(groups)).tolist()
    rows = [{"op": op, "axis": axis, "payload_bytes": size, "group_size": n,
             "instances": count[i], "duration_median_s": med["duration_s"][i],
             "duration_min_s": med["min:duration_s"][i], "wait_median_s": med["wait_s"][i],
             "algbw_GBps": med["algbw_GBps"][i], "busbw_GBps": med["busbw_GBps"][i]}
            for i, (op, axis, size, n) in enumerate(groups)]
    return sorted(rows, key=lambda r: (r["op"], r["axis"], r["payload_bytes"],
                                       r["group_size"]))


def _instance_links(coll: Instances, hosts: dict) -> dict[tuple, tuple]:
    """(axis, link) -> (instances, median duration_s, median busbw) over the kept
    instances, an instance's link links.link_of of its ranks (inter: its ranks' known hosts
    are more than one)."""
    k = coll.keys()
    offsets, values = k["ranks"]
    if not len(offsets) or offsets[-1] == 0:
        return {}
    names = sorted({h for h in hosts.values() if h is not None}, key=repr)
    idx = {h: i for i, h in enumerate(names)}
    top = int(values.max(initial=0)) + 1
    host = np.full(max(top, max(hosts, default=-1) + 1), -1, np.int64)
    for r, h in hosts.items():
        if h is not None and r >= 0:
            host[r] = idx[h]
    h = np.where(values < len(host), host[np.minimum(values, len(host) - 1)], -1)
    starts = offsets[:-1]
    hi = np.maximum.reduceat(h, starts)
    lo = np.minimum.reduceat(np.where(h < 0, np.iinfo(np.int64).max, h), starts)
    inter = (hi >= 0) & (lo < hi)
    ax, axes = k["axis"]
    code, uniq = _factorize(ax * 2 + inter)
    med = _medians(code, len(uniq), {"duration_s": coll.values("duration_s"),
                                     "busbw_GBps": coll.values("busbw_GBps")})
    count = np.bincount(code, minlength=len(uniq)).tolist()
    return {(axes[u // 2], "inter" if u % 2 else "intra"):
            (count[i], med["duration_s"][i], med["busbw_GBps"][i])
            for i, u in enumerate(uniq.tolist())}


def links_table(con, tr: Traces, spec, coll, pred: dict | None,
                sums: dict) -> list[dict] | None:
    """links.links_table: per-record bytes from np_axis.axis_sums' `raw` sums (the axis_bytes
    table's), instance medians from the instances (`coll`: an Instances or the file's
    path); tr: vec_tables.meta_traces. None where a span's step / cat sits in args (the
    caller takes the Python path). A NULL axis and an axis named "?" on one rank would merge
    in the oracle's (rank, "?") and not here."""
    from .vec_tables import in_args
    if in_args(con, "span", ("step", "cat")):
        return None
    coll = coll if isinstance(coll, Instances) else Instances(coll)
    hosts, source = LK.rank_hosts(tr, spec)
    groups = LK._Groups(tr, spec)
    per: dict[tuple, dict] = {}
    for (rank, axis), v in sums["raw"].items():
        if not v["records"]:  # setup records only: no per-step bytes
            continue
        b, n = v["sent"], v["steps"]
        link = LK.link_of(groups.members(rank, {"axis": axis} if axis is not None else {}),
                          hosts)
        row = per.setdefault(("?" if axis is None else axis, link), {"ranks": set(),
                                                                     "per_step": []})
        row["ranks"].add(rank)
        row["per_step"].append(b / n if n else 0.0)
    inst = _instance_links(coll, hosts) if coll.exists() else {}
    theory = {x["axis"]: x for x in (((pred or {}).get("comm") or {}).get("links") or {})
              .get("per_axis", [])}
    rows = []
    for axis, link in sorted(set(per) | set(inst)):
        p = per.get((axis, link), {"ranks": set(), "per_step": []})
        cnt, dmed, bmed = inst.get((axis, link), (0, None, None))
        t = theory.get(axis, {})
        rows.append({
            "axis": axis, "link": link, "ranks": len(p["ranks"]), "instances": cnt,
            "bytes_sent_per_step": max(p["per_step"], default=None),
            "duration_median_s": dmed, "busbw_GBps": bmed,
            "hosts": len(set(hosts.values()) - {None}), "hosts_source": source,
            "predicted_link": t.get("link"), "predicted_bytes": t.get("bytes_per_rank"),
            "predicted_busbw_GBps": t.get("busbw_GBps"), "predicted_time_s": t.get("time_s"),
            "predicted_bandwidth_source": t.get("bandwidth_source")})
    return rows
