"""The stragglers at scale: oracle.stragglers.stragglers_table and
oracle.stragglers.straggler_ranks_table from sums kept as the collective instances are written, not
from a query over their file.

Both tables read, of the multi-rank collectives (`op` not send_recv, step >= 0, two ranks or
more: oracle.stragglers._collective_rows), per (step, last rank) the sums of wait_ns, late_ns and
others_wait_ns and their count, per step the largest clock error; and of every instance its
step (the steady steps are rules.steady over them) and the ranks it names. `Lateness` keeps
exactly these, batch by batch (bandwidth_links.InstanceWriter feeds it, so the live analysis'
batches count too, analyze_live.py); the sums are integers, so their order does not matter
and the result is the one a query over the whole file gave. Waits are summed in integer ns
and then divided (the oracle sums float seconds: equal to 1e-9 relative), and the per-step
argmax takes the largest sum, the lowest rank on a tie (the oracle's max(key=(sum, -rank))).
"""

from __future__ import annotations

import statistics
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import rules

NS = 1e9
STRAGGLER_KEYS = ("step", "rank", "caused_wait_s", "times_last", "step_s", "wait_fraction",
                  "clock_error_s", "flagged")
READS = ("step", "last_rank", "wait_ns", "late_ns", "others_wait_ns", "clock_error_s", "op",
         "n_ranks", "ranks")  # what `add` reads of an instance batch
_SUMS = ("wait_ns", "late_ns", "others_wait_ns")


class Lateness:
    """The sums above, fed one instance batch at a time (`add`)."""

    def __init__(self):
        self.parts: list[tuple] = []  # per batch: (keys, sums (3, k), counts)
        self.clock: list[tuple] = []  # per batch: (steps, largest clock error)
        self.steps: set[int] = set()  # every instance's step >= 0
        self.ranks: set[int] = set()  # every rank an instance names

    @classmethod
    def of_file(cls, path: Path) -> Lateness:
        """The sums of an instance file written already (row group by row group)."""
        import pyarrow.parquet as pq
        out = cls()
        if Path(path).exists():
            pf = pq.ParquetFile(path)
            for i in range(pf.metadata.num_row_groups):
                out.add(pf.read_row_group(i, columns=list(READS)))
        return out

    def add(self, b: pa.Table) -> None:
        step = _np(b["step"], -1)
        self.steps.update(np.unique(step[step >= 0]).tolist())
        self.ranks.update(np.unique(pc.list_flatten(b["ranks"]).to_numpy(
            zero_copy_only=False)).tolist())
        op = b["op"]
        p2p = pc.fill_null(pc.equal(op.cast(pa.string()) if pa.types.is_dictionary(op.type)
                                    else op, "send_recv"), False)
        m = (step >= 0) & (_np(b["n_ranks"], 0) >= 2) & ~np.asarray(p2p)
        if not m.any():
            return
        last = _np(b["last_rank"], 0)[m]
        st = step[m]
        assert last.min() >= 0 and last.max() < 1 << 31 and st.max() < 1 << 31
        key = st << 31 | last
        order = np.argsort(key, kind="stable")
        key = key[order]
        starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
        sums = np.stack([np.add.reduceat(_np(b[c], 0)[m][order], starts) for c in _SUMS])
        self.parts.append((key[starts], sums, np.diff(np.r_[starts, len(key)])))
        clk = np.asarray(pc.fill_null(b["clock_error_s"], 0.0), np.float64)[m][order]
        s = st[order]
        first = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
        self.clock.append((s[first], np.maximum.reduceat(clk, first)))

    def per_last(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(step, last rank, sums (3, n): wait_ns, late_ns, others_wait_ns, count) per
        (step, last rank), by step then rank, every batch's summed."""
        if not self.parts:
            z = np.zeros(0, np.int64)
            return z, z, np.zeros((3, 0), np.int64), z
        key = np.concatenate([k for k, _, _ in self.parts])
        sums = np.concatenate([s for _, s, _ in self.parts], axis=1)
        cnt = np.concatenate([c for _, _, c in self.parts])
        order = np.argsort(key, kind="stable")
        key, sums, cnt = key[order], sums[:, order], cnt[order]
        starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
        k = key[starts]
        return (k >> 31, k & ((1 << 31) - 1), np.add.reduceat(sums, starts, axis=1),
                np.add.reduceat(cnt, starts))

    def clock_of(self, steps: np.ndarray) -> np.ndarray:
        """max(0, the largest clock error of each step's multi-rank collectives)."""
        s = np.concatenate([x for x, _ in self.clock]) if self.clock else np.zeros(0, np.int64)
        c = np.concatenate([y for _, y in self.clock]) if self.clock else np.zeros(0)
        out = np.zeros(len(steps))
        if len(s):
            u, inv = np.unique(s, return_inverse=True)
            mx = np.full(len(u), -np.inf)
            np.maximum.at(mx, inv, c)
            out = np.maximum(0.0, mx[np.searchsorted(u, steps)])
        return out


def stragglers_table(late: Lateness, step_s: pa.Table) -> pa.Table:
    """oracle.stragglers.stragglers_table as a table (one row per step, its columns the oracle's
    keys, by step). step_s: columns step, step_s (the max over ranks of the step_rank rows)."""
    step, rank, sums, cnt = late.per_last()
    if not len(step):
        return pa.table({k: [] for k in STRAGGLER_KEYS})
    w = sums[0]
    # per step the largest sum, the lowest rank on a tie: sorted by (step, -w, rank)
    order = np.lexsort((rank, -w, step))
    first = order[np.flatnonzero(np.r_[True, step[order][1:] != step[order][:-1]])]
    st, rk, caused, times = step[first], rank[first], w[first] / NS, cnt[first]
    clock = late.clock_of(st)
    ss = np.asarray(step_s["step"].to_numpy(zero_copy_only=False), np.int64)
    sv = np.asarray(step_s["step_s"].to_numpy(zero_copy_only=False), np.float64)
    u, inv = np.unique(ss, return_inverse=True)
    mx = np.zeros(len(u))  # max(0, the step's slowest rank), as the oracle's from 0.0
    np.maximum.at(mx, inv, sv)
    pos = np.minimum(np.searchsorted(u, st), max(len(u) - 1, 0))
    has = (u[pos] == st) if len(u) else np.zeros(len(st), bool)
    s_val = np.where(has, mx[pos] if len(u) else 0.0, 0.0)
    div = has & (s_val != 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = np.where(div, caused / np.where(div, s_val, 1.0), 0.0)
    flagged = div & (frac >= rules.STRAGGLER_MIN_WAIT_FRACTION) & (caused > clock)
    return pa.table({"step": pa.array(st, pa.int64()), "rank": pa.array(rk, pa.int64()),
                     "caused_wait_s": caused, "times_last": pa.array(times, pa.int64()),
                     "step_s": pa.array(s_val, pa.float64(), mask=~has),
                     "wait_fraction": pa.array(frac, pa.float64(), mask=~div),
                     "clock_error_s": clock, "flagged": pa.array(flagged, pa.bool_())})


def straggler_rows(table: pa.Table) -> list[dict]:
    """stragglers_table's Table as the oracle's rows."""
    return table.select(list(STRAGGLER_KEYS)).to_pylist()


def straggler_ranks_table(late: Lateness, step_ranks) -> list[dict]:
    """oracle.stragglers.straggler_ranks_table; step_ranks: the ranks of the step_rank rows."""
    ranks = set(step_ranks) | late.ranks
    use = np.asarray(rules.steady(sorted(late.steps)), np.int64)
    step, rank, sums, cnt = late.per_last()
    keep = np.isin(step, use)
    per = {}
    for k in np.unique(rank[keep]).tolist():  # ranks last in a steady step: a few
        m = keep & (rank == k)
        ls = sums[1][m]  # per step of its, Σ late_ns
        per[k] = {"times": int(cnt[m].sum()), "late": int(ls.sum()),
                  "ls": ls[ls > 0].tolist(), "others": int(sums[2][m].sum())}
    return _rank_rows(ranks, per, len(use))


def _rank_rows(ranks: set, per: dict, n: int) -> list[dict]:
    total = sum(x["others"] for x in per.values())
    rows = []
    for k in sorted(ranks):
        x = per.get(k) or {"times": 0, "late": 0, "ls": [], "others": 0}
        # a rank never last sums an empty dict in the oracle: the int 0
        tot, late = (x["late"] / NS if k in per else 0), [v / NS for v in x["ls"]]
        rows.append({"rank": k, "times_last": x["times"], "late_s": tot,
                     "cost_per_step_s": tot / n if n else None, "late_steps": len(late),
                     "cost_median_s": statistics.median(late) if late else None,
                     "others_wait_s": x["others"] / NS,
                     "wait_share": x["others"] / total if total else None, "steps": n})
    return rows


def _np(col, fill) -> np.ndarray:
    return np.asarray(pc.fill_null(col, fill).to_numpy(zero_copy_only=False), np.int64)
