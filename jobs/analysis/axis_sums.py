"""Bytes per rank and mesh axis from a run's Parquet files: the one input of
oracle.collectives.axis_bytes_table's columnar twin (trace_sql.axis_bytes_table) and of the links
table at scale (bandwidth_links.links_table), summed over step_ranges's rows (`COLS`, strings as
dictionaries): each rank's setup records, then its rows step range by step range (the scale
path feeds the same read the step sweep and the collectives take, one_read.one_read).

Per (rank, axis), as axis_bytes_table forms them: bytes sent and received by the comm records
of training steps (step >= 0), bytes sent by the setup ones (step < 0 or none), the number of
training comm records, and `steps` = |the rank's `step` spans' steps U the axis's comm steps|
(ranges hold disjoint steps: the rank's span steps plus, per range, the axis's comm steps
without a span). Sums are sequential, as the oracle's `+=`: np.bincount adds each bin's
weights in input order, and the running sums enter each range's bincount as its first
weights (np.sum's pairwise order could differ in the last bit); the order is the file's
within a range, range after range. Keyed twice: `merged` (an absent axis is "?", the
oracle's r.get("axis", "?")) and `raw` (absent stays None: links asks the mesh for the group
of a record that names its axis, and for the default group otherwise).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .step_sweep import codes

COLS = ("type", "step", "cat", "axis", "op", "bytes_sent", "bytes_recv", "peer")
DICT = ("type", "cat", "axis", "op")
# what only MoE tables read (engine.RARE): whether a rank has any, from this same read
RARE_TYPES, RARE_OPS = ("moe",), ("all_to_all",)
_KINDS = ("merged", "raw")


class Sums:
    """The per (rank, axis) sums, fed one rank's rows at a time (`add`), read by `result`."""

    def __init__(self):
        self.bins: dict[str, dict[tuple, int]] = {k: {} for k in _KINDS}  # (rank, axis) -> bin
        # per kind and bin: sent, recv, setup (float); records, extra steps (int)
        self.f = {k: np.zeros((3, 0)) for k in _KINDS}
        self.n = {k: np.zeros((2, 0), np.int64) for k in _KINDS}
        self.span_steps: dict[int, int] = {}
        self.rare = False
        # (rank, raw axis, peer) -> [bytes sent, records] of the training steps' point-to-point
        # records: links takes each one's link from its two ends, not the axis's group
        self.p2p: dict[tuple, list] = {}

    def _bin_of(self, kind: str, rank: int, labels: list) -> np.ndarray:
        """The bins of (rank, label) per label, new ones added (arrays grown)."""
        table = self.bins[kind]
        out = np.array([table.setdefault((rank, x), len(table)) for x in labels], np.int64)
        grow = len(table) - self.f[kind].shape[1]
        if grow > 0:
            self.f[kind] = np.pad(self.f[kind], ((0, 0), (0, grow)))
            self.n[kind] = np.pad(self.n[kind], ((0, 0), (0, grow)))
        return out

    def add(self, rank: int, t, train: bool) -> None:
        """One rank's rows (step_ranges, COLS): one step range's (train) or its setup rows."""
        if not set(COLS) <= set(t.column_names):
            self.rare = True
            return
        typ = t.column("type")
        comm = codes(typ, ("comm",))
        self.rare = self.rare or bool(codes(typ, RARE_TYPES).any()
                                      or (comm & codes(t.column("op"), RARE_OPS)).any())
        step = np.asarray(t.column("step").fill_null(-1).to_numpy(zero_copy_only=False),
                          np.int64)
        spans = np.zeros(0, np.int64)
        if train:
            spans = np.unique(step[codes(typ, ("span",)) & codes(t.column("cat"), ("step",))])
            self.span_steps[rank] = self.span_steps.get(rank, 0) + len(spans)
        c = np.flatnonzero(comm)
        if not len(c):
            return
        axis = t.column("axis").combine_chunks()
        names = axis.dictionary.to_pylist()
        code = np.asarray(axis.indices.fill_null(len(names)).to_numpy(zero_copy_only=False),
                          np.int64)[c]
        sent = _floats(t.column("bytes_sent"))[c]
        recv = _floats(t.column("bytes_recv"))[c]
        st = step[c]
        if train:
            self._add_p2p(rank, t, c, code, names, sent)
        for kind in _KINDS:
            label = [*names, "?" if kind == "merged" else None]
            present = np.flatnonzero(np.bincount(code, minlength=len(label)))
            bins = self._bin_of(kind, rank, [label[i] for i in present])
            lut = np.zeros(len(label), np.int64)
            lut[present] = bins
            b = lut[code]
            nb = self.f[kind].shape[1]
            head = np.arange(nb)  # the running sums first: each bin's sum stays sequential
            f, n = self.f[kind], self.n[kind]
            if train:
                f[0] = np.bincount(np.r_[head, b], np.r_[f[0], sent], minlength=nb)
                f[1] = np.bincount(np.r_[head, b], np.r_[f[1], recv], minlength=nb)
                n[0] += np.bincount(b, minlength=nb)
                ub = np.flatnonzero(np.bincount(b))  # bins, not codes: "?" merges
                row = np.zeros(ub[-1] + 1, np.int64)
                row[ub] = np.arange(len(ub))
                n[1, ub] += _steps_without_span(st, row[b], len(ub), spans)
            else:
                f[2] = np.bincount(np.r_[head, b], np.r_[f[2], sent], minlength=nb)

    def _add_p2p(self, rank: int, t, c, code, names: list, sent) -> None:
        from .collectives import P2P
        m = codes(t.column("op"), tuple(P2P))[c]
        if not m.any():
            return
        peer = t.column("peer")
        pv = np.asarray(peer.fill_null(-1).to_numpy(zero_copy_only=False), np.int64)[c][m]
        pnull = np.asarray(peer.is_null().to_numpy(zero_copy_only=False))[c][m]
        label = [*names, None]
        keys = np.column_stack((code[m], pv, pnull))
        uniq, inv = np.unique(keys, axis=0, return_inverse=True)
        inv = inv.reshape(-1)
        tot = np.bincount(inv, sent[m], minlength=len(uniq))
        cnt = np.bincount(inv, minlength=len(uniq))
        for (a, q, z), b, k in zip(uniq.tolist(), tot.tolist(), cnt.tolist(), strict=True):
            x = self.p2p.setdefault((rank, label[a], None if z else q), [0.0, 0])
            x[0] += b
            x[1] += k

    def result(self) -> dict:
        """{"merged": {(rank, axis): sums}, "raw": {...}, "p2p": {(rank, raw axis, peer):
        (sent, records)}, "rare": bool}."""
        out: dict = {"rare": self.rare, "p2p": {k: tuple(v) for k, v in self.p2p.items()}}
        for kind in _KINDS:
            f, n = self.f[kind], self.n[kind]
            out[kind] = {key: {"sent": float(f[0, b]), "recv": float(f[1, b]),
                               "setup": float(f[2, b]), "records": int(n[0, b]),
                               "steps": self.span_steps.get(key[0], 0) + int(n[1, b])}
                         for key, b in self.bins[kind].items()}
        return out


def _steps_without_span(st, row, rows: int, spans) -> np.ndarray:
    """Per row 0..rows-1: how many distinct steps of its records (`st`, by `row`) have no
    `step` span (`spans`): presence counts over the range's steps, no sort."""
    base = int(st.min())
    width = int(st.max()) - base + 1
    seen = np.bincount(row * width + (st - base), minlength=rows * width) > 0
    span = np.zeros(width, bool)
    span[spans[(spans >= base) & (spans < base + width)] - base] = True
    return (seen.reshape(rows, width) & ~span).sum(axis=1)


def _floats(col) -> np.ndarray:
    return np.asarray(col.fill_null(0.0).to_numpy(zero_copy_only=False), np.float64)


def axis_sums(out_dir: Path) -> dict:
    """{"merged": {(rank, axis): sums}, "raw": {(rank, axis or None): sums}, "rare": bool}
    (module doc); only (rank, axis) pairs with comm records. `rare`: whether a file may hold
    a RARE_TYPES record or a comm record of RARE_OPS (one it could not read counts). Its own
    read of the rank files; the engine feeds Sums from the read it shares."""
    from .step_sweep import CHUNK_RECORDS
    from .storage import step_ranges
    files = step_ranges.open_files(out_dir, COLS, DICT)
    s = Sums()
    for lo, _hi, tabs in step_ranges.scan(files, CHUNK_RECORDS):
        for rank, t in sorted(tabs.items()):
            s.add(rank, t, train=lo is not None)
    return s.result()
