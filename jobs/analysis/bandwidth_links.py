"""The tables built on the collectives at scale, from the instances' Parquet file
(instances.instance_batches, written by InstanceWriter), in numpy:

    bandwidth_table   (the oracle's: oracle.collectives.bandwidth_table)
    links_table       (oracle.links.links_table; + per-record bytes from axis_sums)

(the straggler tables are summed as the instances are written: straggler_sums.py). Definitions
stay where they are: steady steps are rules.steady, an instance's link links.link_of of its
ranks' hosts (links.rank_hosts). Medians are statistics.median's to the last bit (_median
of a group's values: the middle one, or the mean of the middle two); a DuckDB query did these
tables before (median: lo + (hi - lo) / 2, 1 ulp off) at 2.5 times the CPU (docs/benchmarks.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from . import instances as N
from . import links as LK
from . import rules
from .storage.load import Traces

NS = 1e9
# strings as dictionaries, statistics on `step` (what the readers filter on): the floats'
# dictionaries and statistics are write time spent for nothing
WRITE = {"compression": "snappy", "use_dictionary": ["op", "axis", "group", "backend_op",
                                                      "phase"], "write_statistics": ["step"]}


class InstanceWriter:
    """The instances' file written batch by batch (one row group per batch, each in the
    oracle's order: the file is by step range, then as collectives_table orders); `sample`:
    called with each batch as written (the engine's Sampler of analysis.json's rows)."""

    def __init__(self, path: Path, sample=None):
        from .straggler_sums import Lateness
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

    def close(self, tr: Traces | None = None, ctx=None) -> int:
        """The file closed (none written without an instance); the count. `tr`: where
        collectives_table's incomplete-instances warning goes; `ctx`: the instances stream's,
        whose group ids the file's bw_key and link_key hold (instance_groups; written to its
        metadata, GROUPS_KEY, for Instances)."""
        if self.writer is not None:
            if ctx is not None:
                self.writer.add_key_value_metadata({GROUPS_KEY: json.dumps(
                    ctx.groups.metadata())})
            self.writer.close()
            self.writer = None
        if tr is not None:
            N.warn_incomplete(tr, self.incomplete)
        return self.n


def write_instances(tr: Traces, out_dir: Path, path: Path, sample=None,
                    passes=None, hosts: dict | None = None) -> int:
    """instances.instance_batches of the run in `out_dir` (`passes`: its comm records per pass,
    when read already) streamed to `path` (InstanceWriter); the count. Appends
    collectives_table's incomplete-instances warning to tr.warnings. No file is written when
    there is no instance. `hosts`: links.rank_hosts' (default: from tr and its meta's spec).
    A field kept in a record's args is read as missing (engine.hidden_fields)."""
    if hosts is None:
        from .predicted import spec_of
        hosts = LK.rank_hosts(tr, spec_of(tr.spec_dict(), []))[0]
    out = InstanceWriter(path, sample)
    stream = N.InstanceStream(tr, hosts)
    try:
        for b in N.instance_batches(tr, out_dir, passes, stream):
            out.write(b)
    except BaseException:
        out.close()  # what was written stays readable; the caller removes it
        raise
    return out.close(tr, stream.ctx)


GROUPS_KEY = b"paralab.groups"  # the instance file's bw_key / link_key groups and hosts


class Instances:
    """The instances' file and what the two tables read of it, a row group or a column at a
    time (a whole column of the 13.6 M instances of a 50 M-record run is 109 MB): of the
    steady steps' instances with a bandwidth group (bw_key >= 0: complete, with a busbw:
    the oracle's filter, instance_groups.Groups.keys) their bandwidth and link groups (`keys`), and
    per group the medians of the value columns (`medians`: each column read once for both
    tables). `steps`: the instances' steps >= 0 when known (straggler_sums.Lateness.steps;
    else read from the file)."""

    VALUES = ("duration_s", "busbw_GBps", "wait_s", "algbw_GBps")
    LINKS = ("duration_s", "busbw_GBps")  # what the links' medians read

    def __init__(self, path: Path, steps=None):
        self.path, self.steps = Path(path), steps
        self._keys = None
        self._med = None

    def exists(self) -> bool:
        return self.path.exists()

    def _groups(self):
        """The file and its row groups' indices."""
        pf = pq.ParquetFile(self.path)
        return pf, range(pf.metadata.num_row_groups)

    def keys(self) -> dict:
        """{"bw": (group code per kept row, group tuples), "links": (the same), "hosts": the
        hosts the links were taken with, "masks": per row group, which rows are kept,
        "n": kept rows}."""
        if self._keys is not None:
            return self._keys
        pf, groups = self._groups()
        meta = json.loads(pf.metadata.metadata[GROUPS_KEY])
        steps = self.steps
        if steps is None:
            steps = set()
            for i in groups:
                steps.update(pc.unique(pf.read_row_group(i, columns=["step"])["step"])
                             .to_pylist())
        use = np.asarray(rules.steady(sorted(x for x in steps if x is not None and x >= 0)),
                         np.int64)
        masks, bw, link = [], [], []
        for i in groups:
            t = pf.read_row_group(i, columns=["step", "bw_key", "link_key"])
            b = np.asarray(t["bw_key"].to_numpy(zero_copy_only=False), np.int32)
            m = (b >= 0) & np.isin(np.asarray(t["step"].to_numpy(zero_copy_only=False)), use)
            masks.append(m)
            bw.append(b[m])
            link.append(np.asarray(t["link_key"].to_numpy(zero_copy_only=False), np.int32)[m])
        self._keys = {"bw": (_cat(bw, np.int32), [tuple(x) for x in meta["bw"]]),
                      "links": (_cat(link, np.int32), [tuple(x) for x in meta["links"]]),
                      "hosts": {r: h for r, h in meta["hosts"]}, "masks": masks,
                      "n": int(sum(int(m.sum()) for m in masks))}
        return self._keys

    def values(self, name: str) -> np.ndarray:
        """A float column's values of the kept rows, in file order."""
        pf, groups = self._groups()
        k = self.keys()
        out, at = np.empty(k["n"]), 0
        for i in groups:
            v = np.asarray(pf.read_row_group(i, columns=[name])[name].to_numpy(
                zero_copy_only=False), np.float64)[k["masks"][i]]
            out[at:at + len(v)] = v
            at += len(v)
        return out

    def medians(self) -> dict:
        """{"bw": per bandwidth group {"count", "min:duration_s", a median per value
        column}, "links": per link group the same of LINKS}; each value column read once."""
        if self._med is not None:
            return self._med
        k = self.keys()
        (bw, bws), (link, links) = k["bw"], k["links"]
        out = {"bw": {"count": np.bincount(bw, minlength=len(bws)).tolist()},
               "links": {"count": np.bincount(link, minlength=len(links)).tolist()}}
        for name in self.VALUES if k["n"] else ():
            v = self.values(name)
            out["bw"][name] = _by_group(_median, bw, len(bws), v)
            if name == "duration_s":
                out["bw"]["min:" + name] = _by_group(np.min, bw, len(bws), v)
            if name in self.LINKS:
                out["links"][name] = _by_group(_median, link, len(links), v)
        self._med = out
        return out


def _cat(parts: list, dtype=np.int64) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(0, dtype)


def _median(a: np.ndarray) -> float:
    """statistics.median of `a` (a copy, partitioned in place): the middle value, or
    (lo + hi) / 2 of the middle two for an even count."""
    n = len(a)
    k = n // 2
    if n % 2:
        a.partition(k)
        return float(a[k])
    a.partition([k - 1, k])
    return (float(a[k - 1]) + float(a[k])) / 2


FEW_GROUPS = 32  # up to this many groups, one pass over the values each (no sort)


def _by_group(f, code: np.ndarray, n: int, v: np.ndarray) -> list[float | None]:
    """f (_median, np.min) of each group 0..n-1's values (None: a group without a kept
    row: its instances were all in warm-up steps)."""
    if n <= FEW_GROUPS:
        parts = (v[code == g] for g in range(n))
    else:
        order = np.argsort(code.astype(np.uint16) if n <= 1 << 16 else code, kind="stable")
        bounds = np.searchsorted(code[order], np.arange(n + 1))
        w = v[order]
        parts = (w[a:b].copy() for a, b in zip(bounds[:-1], bounds[1:], strict=True))
    return [float(f(x)) if len(x) else None for x in parts]


def bandwidth_table(coll) -> list[dict]:
    """The bandwidth table (oracle.collectives.bandwidth_table). `coll`: an Instances or the
    file's path."""
    coll = coll if isinstance(coll, Instances) else Instances(coll)
    if not coll.exists():
        return []
    groups = coll.keys()["bw"][1]
    med = coll.medians()["bw"]
    rows = [{"op": op, "axis": axis, "payload_bytes": size, "group_size": n,
             "instances": med["count"][i], "duration_median_s": med["duration_s"][i],
             "duration_min_s": med["min:duration_s"][i], "wait_median_s": med["wait_s"][i],
             "algbw_GBps": med["algbw_GBps"][i], "busbw_GBps": med["busbw_GBps"][i]}
            for i, (op, axis, size, n) in enumerate(groups) if med["count"][i]]
    return sorted(rows, key=lambda r: (r["op"], r["axis"], r["payload_bytes"],
                                       r["group_size"]))


def _sent_by_link(rank: int, axis, v: dict, p2p: dict, groups, hosts: dict) -> dict:
    """link -> bytes sent by a rank's training records on one axis: a point-to-point
    record's link is its two ends' (axis_sums' per-peer sums), the others' the axis group's."""
    out: dict[str, float] = {}
    rest, left = v["sent"], v["records"]
    for (r, a, peer), (b, k) in p2p.items():
        if r == rank and a == axis:
            rec = {"op": "send", "peer": peer, "axis": axis}
            link = LK.link_of(groups.members(rank, rec), hosts)
            out[link] = out.get(link, 0.0) + b
            rest, left = rest - b, left - k
    if left:
        link = LK.link_of(groups.members(rank, {"axis": axis} if axis is not None else {}),
                          hosts)
        out[link] = out.get(link, 0.0) + rest
    return out


def links_table(con, tr: Traces, spec, coll, pred: dict | None,
                sums: dict) -> list[dict]:
    """The links table (oracle.links.links_table): per-record bytes from axis_sums.axis_sums'
    `raw` sums (the axis_bytes table's), instance medians from the instances (`coll`: an
    Instances or the file's path); tr: trace_sql.meta_only. A NULL axis and an axis named
    "?" on one rank would merge in the oracle's (rank, "?") and not here."""
    coll = coll if isinstance(coll, Instances) else Instances(coll)
    hosts, source = LK.rank_hosts(tr, spec)
    groups = LK._Groups(tr, spec)
    per: dict[tuple, dict] = {}
    for (rank, axis), v in sums["raw"].items():
        if not v["records"]:  # setup records only: no per-step bytes
            continue
        n = v["steps"]
        for link, b in _sent_by_link(rank, axis, v, sums.get("p2p", {}), groups,
                                     hosts).items():
            row = per.setdefault(("?" if axis is None else axis, link), {"ranks": set(),
                                                                         "per_step": []})
            row["ranks"].add(rank)
            row["per_step"].append(b / n if n else 0.0)
    inst: dict[tuple, tuple] = {}
    if coll.exists():
        k = coll.keys()
        if k["hosts"] != {r: h for r, h in json.loads(json.dumps(sorted(hosts.items())))}:
            raise ValueError("the instances' links were taken with other hosts")
        med = coll.medians()["links"]
        inst = {g: (med["count"][i], med["duration_s"][i], med["busbw_GBps"][i])
                for i, g in enumerate(k["links"][1]) if med["count"][i]}
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
