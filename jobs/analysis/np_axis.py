"""Bytes per rank and mesh axis from a run's Parquet files (issue 19): the one input of
collectives.axis_bytes_table's columnar twin (vec_tables.axis_bytes_table) and of the links
table at scale (scale_comm.links_table), read once per rank file (`type, step, cat, axis,
bytes_sent, bytes_recv`, strings as dictionaries).

Per (rank, axis), as axis_bytes_table forms them: bytes sent and received by the comm records
of training steps (step >= 0), bytes sent by the setup ones (step < 0 or none), the number of
training comm records, and `steps` = |the rank's `step` spans' steps U the axis's comm steps|.
Sums run in file order (np.bincount's weights: sequential per bin, as the oracle's `+=`;
np.sum's pairwise order could differ in the last bit). Keyed twice: `merged` (an absent
axis is "?", the oracle's r.get("axis", "?")) and `raw` (absent stays None: links asks the
mesh for the group of a record that names its axis, and for the default group otherwise).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from . import columnar
from .np_steps import codes

COLS = ("rank", "type", "step", "cat", "axis", "op", "bytes_sent", "bytes_recv")
# what only MoE tables read (scale.RARE): whether a rank has any, from this same read
RARE_TYPES, RARE_OPS = ("moe",), ("all_to_all",)


def _union_size(a: np.ndarray, b: np.ndarray) -> int:
    """|set(a) | set(b)| of step numbers (>= 0): a presence array where the steps are in the
    tens of millions at most (no hashing), else np.union1d."""
    top = int(max(a.max(initial=-1), b.max(initial=-1)))
    if top > 50_000_000:
        return len(np.union1d(a, b))
    seen = np.zeros(top + 1, bool)
    seen[a] = True
    seen[b] = True
    return int(seen.sum())


def _rank(t) -> tuple[int, dict, dict, bool]:
    rank = int(t.column("rank")[0].as_py())
    step = np.asarray(t.column("step").fill_null(-1).to_numpy(zero_copy_only=False), np.int64)
    stepspan = (codes(t.column("type"), ("span",)) & codes(t.column("cat"), ("step",))
                & (step >= 0))
    span_steps = np.unique(step[stepspan])
    comm = codes(t.column("type"), ("comm",))
    rare = bool(codes(t.column("type"), RARE_TYPES).any()
                or (comm & codes(t.column("op"), RARE_OPS)).any())
    c = np.flatnonzero(comm)
    axis = t.column("axis").combine_chunks()
    names = axis.dictionary.to_pylist()
    code = np.asarray(axis.indices.fill_null(len(names)).to_numpy(zero_copy_only=False),
                      np.int64)[c]
    st = step[c]
    sent = np.asarray(t.column("bytes_sent").fill_null(0.0).to_numpy(zero_copy_only=False),
                      np.float64)[c]
    recv = np.asarray(t.column("bytes_recv").fill_null(0.0).to_numpy(zero_copy_only=False),
                      np.float64)[c]
    train = st >= 0
    out = {}
    for merged in (True, False):
        label = [*names, "?" if merged else None]
        keys = np.array([label.index(x) for x in label], np.int64)[code]  # "?" twice: one key
        # bincount adds each bin's weights in input order, from 0.0: the oracle's `+=` in
        # file order (a pairwise np.sum could differ in the last bit)
        bins = 2 * keys + train  # (key, training step?) -> one bin
        nb = 2 * len(label)
        sums = {k: np.bincount(bins, weights=v, minlength=nb) for k, v in
                (("sent", sent), ("recv", recv))}
        count = np.bincount(bins, minlength=nb)
        acc = {}
        for k in np.flatnonzero(count[0::2] + count[1::2]).tolist():
            acc[label[k]] = {"sent": float(sums["sent"][2 * k + 1]),
                             "recv": float(sums["recv"][2 * k + 1]),
                             "setup": float(sums["sent"][2 * k]),
                             "records": int(count[2 * k + 1]),
                             "steps": _union_size(span_steps, st[bins == 2 * k + 1])}
        out["merged" if merged else "raw"] = acc
    return rank, out["merged"], out["raw"], rare


def axis_sums(out_dir: Path) -> dict:
    """{"merged": {(rank, axis): sums}, "raw": {(rank, axis or None): sums}, "rare": bool}
    (module doc); only (rank, axis) pairs with comm records. `rare`: whether a file may hold
    a RARE_TYPES record or a comm record of RARE_OPS (one it could not read counts)."""
    import pyarrow.parquet as pq
    res: dict = {"merged": {}, "raw": {}, "rare": False}
    for path in sorted(Path(out_dir).glob("trace-rank*" + columnar.SUFFIX)):
        pf = pq.ParquetFile(path, read_dictionary=["type", "cat", "axis", "op"])
        if not pf.metadata.num_rows:
            continue
        if not set(COLS) <= set(pf.schema_arrow.names):
            res["rare"] = True
            continue
        t = pf.read(columns=list(COLS))
        rank, merged, raw, rare = _rank(t)
        res["rare"] |= rare
        for name, acc in (("merged", merged), ("raw", raw)):
            for axis, v in acc.items():
                res[name][(rank, axis)] = v
    return res
