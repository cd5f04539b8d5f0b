"""The first-mismatch scan once the flight rings have wrapped (issue 43, miss 1): every rank
keeps only its last RING = 64 entries per group (jobs/flight.py), so a rank that skipped one
collective keeps a ring that starts one seq earlier than the others'. The scan must start at
the largest ring start (the first seq every rank still holds), else the seqs only one rank
still holds read as an "entry" mismatch and hide the skip.

Hand-built rings: two all-reduces per step (256 B, then 32 B), so step s issues #2s and
#2s + 1; rank 1 skips the 256 B all-reduce of step 40 (#80). Expected by hand: ranks 0 and 2
issued #0-#83 (steps 0-41) and keep #20-#83; rank 1 issued 83 (its #80 is the others' #81)
and keeps #19-#82; the first seq where they disagree is #80, in content (32 B against 256 B),
and rank 1 skipped it."""

from __future__ import annotations

from jobs.analysis.diagnose import diagnose
from jobs.flight import RING
from tests.faults.test_diagnose_unit import entry, flight, write

SKIP = 80  # the collective rank 1 skips (step 40's first)


def _program(n_steps: int) -> list[dict]:
    """Every rank's program: (step, size) per collective, in issue order."""
    return [{"step": s, "size": size} for s in range(n_steps) for size in (256, 32)]


def _ring(program: list[dict]) -> tuple[list[dict], int]:
    """What a rank issued, numbered 0.. in its own order, of which the ring keeps the last
    RING (all completed)."""
    full = [entry(i, p["step"], size=p["size"]) for i, p in enumerate(program)]
    return full[-RING:], len(full)


def _flights() -> dict[int, dict]:
    prog = _program(42)
    fl = {}
    for r in (0, 1, 2):
        mine = prog[:SKIP] + prog[SKIP + 1:] if r == 1 else prog
        ring, issued = _ring(mine)
        f = flight(r, ring, ranks=(0, 1, 2), world=3)
        f["groups"]["dp"]["issued"] = issued  # the ring is a tail: issued counts them all
        f["groups"]["dp"]["completed"] = issued
        fl[r] = f
    return fl


def test_the_rings_really_wrapped_with_different_starts():
    fl = _flights()
    starts = {r: f["groups"]["dp"]["ring"][0]["seq"] for r, f in fl.items()}
    assert starts == {0: 84 - RING, 1: 83 - RING, 2: 84 - RING}  # 20, 19, 20
    assert all(len(f["groups"]["dp"]["ring"]) == RING for f in fl.values())


def test_a_skip_after_the_ring_wrapped_is_named(tmp_path):
    d = diagnose(write(tmp_path, _flights()), status="hung")
    m = d["groups"][0]["first_mismatch"]
    assert m is not None and m["seq"] == SKIP and m["kind"] == "content", m
    assert m["odd_ranks"] == [1] and m["skipped"] == [1]
    assert m["per_rank"][1]["payload_bytes"] == 32 and m["per_rank"][0]["payload_bytes"] == 256
    assert d["sentence"].startswith(f"rank 1 skipped all_reduce #{SKIP} of group dp [0, 1, 2] "
                                    f"at step 40 (its #{SKIP} is the others' #{SKIP + 1})"), \
        d["sentence"]
    assert d["waited_for"] == 1



def test_a_real_hang_after_the_ring_wrapped(tmp_path):
    """On a real torchrun job (tests/faults/harness.py: a 2-layer MLP under dp-allreduce issues
    four all-reduces per step, so step s issues #4s .. #4s + 3): rank 1 hangs before the first
    all-reduce of step 20 (#80), after 80 collectives wrapped the 64-entry ring. Rank 0
    entered #80 (issued 81, keeps #17-#80), rank 1 did not (issued 80, keeps #16-#79): the
    first position both still hold where they disagree is #80, by entry. (A real skip leaves
    both ranks blocked in the same #80, rings alike: the unit case above covers it.)"""
    from tests.faults.harness import run_faulty, spec
    step, seq = 20, 80
    r = run_faulty(tmp_path / "run", spec(2, [{"kind": "hang", "ranks": [1], "step": step,
                                              "op": "all_reduce"}], steps=22))
    assert r["alive"] == [], "rank processes left behind"
    assert r["status"] == "hung"
    d = r["diagnosis"]
    g = next(g for g in d["groups"] if g["key"] == "dp")
    assert (g["per_rank"][0]["issued"], g["per_rank"][1]["issued"]) == (seq + 1, seq)
    m = g["first_mismatch"]
    assert m is not None and (m["seq"], m["kind"], m["odd_ranks"]) == (seq, "entry", [1]), m
    assert d["sentence"].startswith(f"rank 1 never entered all_reduce #{seq} of group dp "
                                    f"[0, 1] (step {step}); rank 0 waits there"), d["sentence"]
