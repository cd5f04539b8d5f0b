"""The groups the bandwidth and links tables take their medians over, fixed per
collective instance when instances forms it, so that the tables after the run read two integer
columns of the instance file (bandwidth_links.Instances) instead of its keys and rank lists:

    bw_key     the instance's (op, str(axis), payload bytes, group size): collectives.
               bandwidth_table's group
    link_key   its (str(axis), link): oracle.links.links_table's, the link links.link_of of its
               ranks' hosts (links.rank_hosts), "inter" when they span more than one

Both -1 where the instance does not count (incomplete, or without a busbw: the tables'
filter; the steady steps are applied after the run, when all are known). Ids are given in
order of first appearance over the whole run (`Groups`, shared by every pass), and written
with the hosts to the instance file's metadata (bandwidth_links.GROUPS_KEY).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


class Groups:
    """The run's group ids so far, and the hosts the links are taken with."""

    def __init__(self, hosts: dict | None = None):
        self.hosts = dict(hosts or {})
        names = sorted({h for h in self.hosts.values() if h is not None}, key=repr)
        self.host = np.full(max(self.hosts, default=-1) + 1, -1, np.int64)  # rank -> host id
        for r, h in self.hosts.items():
            if h is not None and r >= 0:
                self.host[r] = names.index(h)
        self.bw_ids: dict[tuple, int] = {}
        self.link_ids: dict[tuple, int] = {}

    def metadata(self) -> dict:
        """What the instance file's metadata holds of them (JSON-able)."""
        return {"bw": list(self.bw_ids), "links": list(self.link_ids),
                "hosts": sorted(self.hosts.items())}

    def inter(self, rk: np.ndarray, starts: np.ndarray) -> np.ndarray:
        """Per instance (its ranks rk[starts[i]:starts[i + 1]]): whether their known hosts
        are more than one (links.link_of says "inter")."""
        if not len(starts):
            return np.zeros(0, bool)
        h = np.full(len(rk), -1, np.int64)
        ok = (rk >= 0) & (rk < len(self.host))
        h[ok] = self.host[rk[ok]]
        hi = np.maximum.reduceat(h, starts)
        lo = np.minimum.reduceat(np.where(h < 0, np.iinfo(np.int64).max, h), starts)
        return (hi >= 0) & (lo < hi)

    def keys(self, opc, ops, axc, axes, payload, size, rk, starts, counted):
        """(bw_key, link_key) per instance of a batch: `opc` / `axc` its op and axis codes
        into `ops` / `axes` (the axis as str(), a null as "None"), `payload`, `size` (its
        group size), its ranks `rk` by instance from `starts`, and whether it `counted`."""
        if not len(starts):
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        pay, pays = factorize(payload)
        gs, gss = factorize(size)
        local, combo = factorize(((opc * len(axes) + axc) * len(pays) + pay) * len(gss) + gs)
        tuples = []
        for c in combo.tolist():
            c, g = divmod(c, len(gss))
            c, y = divmod(c, len(pays))
            o, a = divmod(c, len(axes))
            tuples.append((ops[o], axes[a], int(pays[y]), int(gss[g])))
        bw = _ids(self.bw_ids, local, tuples)
        local, combo = factorize(axc * 2 + self.inter(rk, starts))
        link = _ids(self.link_ids, local, [(axes[c // 2], "inter" if c % 2 else "intra")
                                           for c in combo.tolist()])
        return np.where(counted, bw, -1), np.where(counted, link, -1)


def _ids(ids: dict, local: np.ndarray, tuples: list) -> np.ndarray:
    """Run-wide ids of a batch's groups: `local` indexes `tuples` (its distinct keys)."""
    lut = np.array([ids.setdefault(k, len(ids)) for k in tuples], np.int64)
    return lut[local] if len(lut) else local


def factorize(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(codes, distinct values) of an int array, by hashing (no sort of the instances):
    codes index the values in order of first appearance."""
    d = pc.dictionary_encode(pa.array(x, pa.int64()))
    return (np.asarray(d.indices.to_numpy(zero_copy_only=False), np.int64),
            np.asarray(d.dictionary.to_numpy(zero_copy_only=False), np.int64))
