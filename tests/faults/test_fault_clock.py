"""The fault engine's timing logic on an injected clock (issue 43, "wall-clock dependence"): no
real sleep, no launch. `jobs.faults.time` is replaced by a virtual clock whose sleep advances
it, so a slow rank's delay and a crash's wait for its peers are exact, whatever the machine's
load. test_fault_runs.py keeps one real launch per feature.

- slow: two ranks run the injector through a step loop of four all-reduces in lockstep (a
  collective ends when its last rank arrives); the traced records go through the analysis,
  whose straggler figures are checked against numbers computed here by hand.
- crash: the crash holds until the peer's flight file shows it blocked in this step's
  collective, or gives up after PEER_WAIT_S (virtual seconds)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from devtools.oracle import analyze_run_dir
from jobs import faults
from jobs.faultspec import FaultSpec
from tests.analysis import synth as s

US = 1000  # ns: the virtual clock counts integer nanoseconds, as the traces do
D = 0.3  # the slow rank's delay (virtual seconds)
SPEC = {"model": {"arch": "mlp", "hidden": 8, "layers": 2},
        "parallel": {"dp": 2, "dp_mode": "allreduce"}, "train": {"steps": 4, "global_batch": 8},
        "runtime": {"nproc_per_node": 2}}


class Clock:
    """Virtual integer nanoseconds per rank; `sleep` advances the rank whose turn it is
    (`who`)."""

    def __init__(self, ranks):
        self.t = dict.fromkeys(ranks, 0)
        self.who = 0
        self.slept: list[tuple[int, float]] = []

    def sleep(self, dt):
        self.slept.append((self.who, dt))
        self.t[self.who] += round(dt * 1e9)

    def monotonic(self):
        return self.t[self.who] / 1e9


def timed(rec: dict, t0: int, t1: int) -> dict:
    """A synth record placed at exact integer ns."""
    rec["ts_ns"], rec["dur_ns"] = t0, t1 - t0
    return rec


def simulate(monkeypatch, tmp_path, fault: dict, steps: int = 4, world: int = 2):
    """Run the injectors of `world` ranks through `steps` steps: forward (rank 0 100 µs,
    rank 1 99 µs), four all-reduces (rank 0 5 µs, rank 1 3 µs between them, each ending
    10 µs after its last arrival), an optimizer of 20 µs. Returns (run folder, clock)."""
    clock = Clock(range(world))
    monkeypatch.setattr(faults, "time", SimpleNamespace(sleep=clock.sleep,
                                                        monotonic=clock.monotonic))
    f = FaultSpec(**{"steps": 1, **fault, "ranks": tuple(fault["ranks"])})
    tr = {r: SimpleNamespace(step=-1, rank=r) for r in range(world)}
    inj = {r: faults.Injector((f,), r, 0, tr[r]) for r in range(world)}
    recs = {r: [s.meta(r, world, {"pp": 0, "dp": r, "tp": 0}, SPEC if r == 0 else None)]
            for r in range(world)}
    seq = 0
    for st in range(steps):
        start = dict(clock.t)
        for r in range(world):
            clock.who, tr[r].step = r, st
            inj[r].at_step(st)
            t0 = clock.t[r]
            clock.t[r] += (100 if r == 0 else 99) * US
            recs[r].append(timed(s.span(r, st, "forward", 0, 0, mb=0), t0, clock.t[r]))
        for j in range(4):
            arrive = {}
            for r in range(world):
                clock.who = r
                if j:
                    clock.t[r] += (5 if r == 0 else 3) * US
                assert inj[r].on_comm("all_reduce", "dp", "dp", 1024, world, {}) is None
                arrive[r] = clock.t[r]
            end = max(arrive.values()) + 10 * US
            for r in range(world):
                recs[r].append(timed(s.comm(r, st, "all_reduce", 0, 0, n=world, payload=1024,
                                            seq=seq), arrive[r], end))
                clock.t[r] = end
            seq += 1
        for r in range(world):
            clock.t[r] += 20 * US
            recs[r].append(timed(s.span(r, st, "step", 0, 0, cat="step", loss=1.0), start[r],
                                 clock.t[r]))
    for r in range(world):
        recs[r].append(s.end(r, clock.t[r] // 1000 + 1))
    return s.write(tmp_path / "run", recs, {"loss": [1.0] * steps}), clock


@pytest.mark.parametrize("mode", ["compute", "comm"])
def test_a_slow_rank_is_named_with_its_exact_cost(monkeypatch, tmp_path, mode):
    run, clock = simulate(monkeypatch, tmp_path, {"kind": "slow", "ranks": [1], "step": 1,
                                                  "steps": 3, "delay_s": D, "mode": mode})
    # the delay fires once per step of the fault's window, on the faulty rank only
    assert clock.slept == [(1, D)] * 3
    a = analyze_run_dir(run)
    h, per = a["headline"], {x["rank"]: x for x in a["tables"]["straggler_ranks"]}
    # by hand, steady steps 1-3: rank 1 reaches each step's first all-reduce D - 1 µs after
    # rank 0 (99 µs of forward against 100); rank 0 is last at the other three by 2 µs
    late1, late0 = D - 1e-6, 2e-6
    assert per[1]["times_last"] == 3 and per[0]["times_last"] == 9
    assert per[1]["late_s"] == pytest.approx(3 * late1, rel=1e-9)
    assert per[1]["others_wait_s"] == pytest.approx(3 * late1, rel=1e-9)
    assert per[1]["cost_median_s"] == pytest.approx(late1, rel=1e-9)
    assert per[1]["late_steps"] == 3
    assert per[0]["late_s"] == pytest.approx(9 * late0, rel=1e-9)
    assert h["straggler_rank"] == 1 and h["straggler_flagged_steps"] == 3
    assert h["straggler_cost_s"] == pytest.approx(late1, rel=1e-9)
    assert h["straggler_wait_s"] == pytest.approx(late1, rel=1e-9)


def test_no_straggler_without_the_fault(monkeypatch, tmp_path):
    run, clock = simulate(monkeypatch, tmp_path, {"kind": "slow", "ranks": [1], "step": 9,
                                                  "delay_s": D, "mode": "compute"})
    assert clock.slept == []  # step 9 never comes
    a = analyze_run_dir(run)
    # rank 0 is last everywhere, by 1 µs (forward) and 2 µs (the three later all-reduces):
    # 7 µs of a 175 µs step (100 + 10 + 3 x 15 + 20) is 4 %, below the 5 % a straggler
    # must cost: no straggler
    for row in a["tables"]["stragglers"]:
        assert row["rank"] == 0 and not row["flagged"]
        assert row["caused_wait_s"] == pytest.approx(7e-6, rel=1e-9)
        assert row["step_s"] == pytest.approx(175e-6, rel=1e-9)
    assert a["headline"]["straggler_rank"] is None


# -- a crash waits for its peers to block (Injector._peers_waiting)


def flight(path, step: int | None) -> None:
    groups = {"dp": {"in_flight": {"step": step, "op": "all_reduce"}}} if step is not None \
        else {"dp": {"in_flight": None}}
    path.write_text(json.dumps({"groups": groups}))


class PeerClock(Clock):
    """The crashing rank's clock; at `blocks_at` virtual seconds the peer's flight file shows
    it in this step's all-reduce (it computed that much longer)."""

    def __init__(self, path, step, blocks_at):
        super().__init__([0])
        self.path, self.step, self.blocks_at = path, step, blocks_at

    def sleep(self, dt):
        super().sleep(dt)
        if self.blocks_at is not None and self.monotonic() >= self.blocks_at:
            flight(self.path, self.step)


@pytest.mark.parametrize("blocks_at", [1.5, None])
def test_a_crash_holds_until_the_slow_peer_blocks(monkeypatch, tmp_path, blocks_at):
    step = 2
    peer = tmp_path / "flight-rank0.json"
    flight(peer, step - 1)  # computing step 2: its last collective was step 1's
    clock = PeerClock(peer, step, blocks_at)
    monkeypatch.setattr(faults, "time", SimpleNamespace(sleep=clock.sleep,
                                                        monotonic=clock.monotonic))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    tr = SimpleNamespace(step=step, rank=1, world_size=2,
                         flight=SimpleNamespace(path=tmp_path / "flight-rank1.json"))
    f = FaultSpec(kind="crash", ranks=(1,), step=step, mode="exception")
    inj = faults.Injector((f,), 1, 0, tr)
    with pytest.raises(faults.InjectedCrash):
        inj.at_step(step)
    waited = clock.monotonic()
    if blocks_at is None:  # never blocks: gives up after PEER_WAIT_S, not before
        assert faults.PEER_WAIT_S <= waited < faults.PEER_WAIT_S + 0.2
    else:  # released at the first poll after the peer blocked
        assert blocks_at <= waited < blocks_at + 0.2
