"""The flight dumps (jobs/flight.py, `OUT/flight/flight_rank_{R}`) read by PyTorch's own
flight-recorder analyzer, unchanged (torch.distributed.flight_recorder: the oracle), on real
torchrun jobs (tests/faults/harness.py: a 2-layer MLP under dp-allreduce, four all-reduces per
step, so step 2's first is #8): a rank that never enters a collective, a rank that all-reduces a
tensor of half the size. Torch's verdict must name the same rank and collective as paralab's
diagnosis. The unit cases check the ring size (spec `trace.flight_entries`), all-gather /
reduce-scatter sizes (torch's matcher accepts them) and that the JSON view is the dump's.

Torch's matcher takes the first rank it loaded as the reference ("we assume the current rank
is not the source of the error"), so the dumps are handed to it in rank order."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from torch.distributed.flight_recorder.components.builder import build_db
from torch.distributed.flight_recorder.components.config_manager import JobConfig
from torch.distributed.flight_recorder.components.loader import read_dir
from torch.distributed.flight_recorder.components.types import MatchState

from jobs.flight import DEFAULT_ENTRIES, FlightRecorder, dump_path, view
from jobs.spec import parse_spec
from tests.faults.harness import run_faulty, spec

STEP, SEQ = 2, 8  # the first all-reduce of step 2


def torch_db(flight_dir: Path):
    """torch's analyzer (fr_trace's own steps: read_dir, build_db) on a dump folder."""
    args = JobConfig().parse_args([str(flight_dir)])
    details, version = read_dir(args)
    details = dict(sorted(details.items(), key=lambda kv: kv[1]["rank"]))
    return build_db(details, args, version), version


def verdicts(db) -> list:
    """The collectives torch's analyzer flags: missing ranks or a mismatch."""
    return [c for c in db.collectives if not c.pass_check or c.missing_ranks]


def _group(d, key="dp"):
    return next(g for g in d["groups"] if g["key"] == key)


def test_a_hang_torch_and_paralab_name_the_same_rank_and_collective(tmp_path):
    out = tmp_path / "run"
    r = run_faulty(out, spec(4, [{"kind": "hang", "ranks": [3], "step": STEP,
                                  "op": "all_reduce"}]))
    assert r["alive"] == [] and r["status"] == "hung"
    assert sorted(p.name for p in (out / "flight").iterdir()) == [
        f"flight_rank_{k}" for k in range(4)]  # nothing else: fr_trace reads every file
    d = r["diagnosis"]
    m = _group(d)["first_mismatch"]
    assert (d["waited_for"], m["seq"], m["kind"], m["odd_ranks"]) == (3, SEQ, "entry", [3])

    db, version = torch_db(out / "flight")
    assert version == "2.10"
    [c] = verdicts(db)
    assert c.missing_ranks == set(m["odd_ranks"]) == {d["waited_for"]}
    assert c.collective_seq_id == m["seq"]
    assert c.collective_name == f"gloo:{m['expected']['op']}"
    assert c.input_sizes == [[m["expected"]["payload_bytes"] // 4]]  # float32 elements
    assert c.collective_state == "started"  # ranks 0-2 wait in it
    assert c.expected_ranks == {0, 1, 2, 3}
    # the frames: the issuing call, innermost first, where paralab's stack dump has rank 3
    assert c.collective_frames[0]["filename"].endswith("jobs/parallel/base.py")
    assert d["ranks"][3]["stack"].startswith("jobs/parallel/base.py")
    # and the analyzer's command line, as a user would run it on a downloaded run
    p = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace",
                        str(out / "flight")], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    log = p.stdout + p.stderr
    assert f"Not all ranks joining collective, sequence number: {SEQ}" in log
    assert "missing ranks: {3}" in log


def test_a_size_mismatch_torch_and_paralab_name_the_same_rank_and_collective(tmp_path):
    """With the spec's ring at 6 entries (wrapped: #0-#8 issued): torch aligns on record_id."""
    out = tmp_path / "run"
    s = spec(2, [{"kind": "mismatch", "ranks": [1], "step": STEP, "op": "all_reduce",
                  "mode": "size"}])
    s["trace"] = {"flight_entries": 6}
    r = run_faulty(out, s)
    assert r["alive"] == []
    for k in (0, 1):
        d = pickle.loads(dump_path(out, k).read_bytes())
        assert d["paralab"]["ring_entries"] == 6
        assert [e["op_id"] for e in d["entries"]] == list(range(SEQ - 5, SEQ + 1))
    d = r["diagnosis"]
    m = _group(d)["first_mismatch"]
    assert (m["seq"], m["kind"], m["odd_ranks"], d["waited_for"]) == (SEQ, "content", [1], 1)

    db, _ = torch_db(out / "flight")
    [c] = verdicts(db)
    assert c.collective_seq_id == m["seq"] and c.collective_name == "gloo:all_reduce"
    assert set(c.mismatch_collectives) == set(m["odd_ranks"])
    odd = c.mismatch_collectives[1]
    assert odd.type_of_mismatch.state == MatchState.SIZE_OR_SYNTAX_MISMATCH
    assert odd.input_sizes == [[m["per_rank"][1]["payload_bytes"] // 4]]
    assert c.input_sizes == [[m["per_rank"][0]["payload_bytes"] // 4]]


# --- unit: a fake tracer feeding two recorders by hand ------------------------------------------
def _tracer(rank, world=2):
    return SimpleNamespace(rank=rank, world_size=world, coords={}, step=0, steps_completed=0,
                           last_progress_ns=0, now=lambda: 0,
                           group_ranks={"dp": list(range(world))})


def _feed(fr, ops, *, done=True):
    for seq, (op, payload) in enumerate(ops):
        e = fr.enter("dp", seq, op, payload_bytes=payload, dtype="float32", group_size=2,
                     step=0, t_ns=seq)
        if done:
            fr.done("dp", e, seq)


def test_the_ring_size_comes_from_the_spec_and_is_validated():
    base = {"runtime": {"nproc_per_node": 1}}
    assert parse_spec(base).trace.flight_entries == DEFAULT_ENTRIES == 2000
    assert parse_spec({**base, "trace": {"flight_entries": 5}}).trace.flight_entries == 5
    for bad in (0, -1, "many"):
        with pytest.raises(ValueError, match="trace.flight_entries"):
            parse_spec({**base, "trace": {"flight_entries": bad}})


def test_sizes_torch_matches_and_a_wrapped_ring(tmp_path):
    """all_gather's payload is its output, reduce_scatter's its input (jobs/commbytes.py):
    torch's matcher (input numel * group size = output numel) accepts both. Rings of 5 after
    8 ops keep record ids 3-7, which torch aligns on."""
    ops = [("all_reduce", 64), ("all_gather", 64), ("reduce_scatter", 64), ("broadcast", 8),
           ("barrier", 0), ("all_reduce", 64), ("all_gather", 32), ("all_reduce", 16)]
    for r in (0, 1):
        fr = FlightRecorder(tmp_path / f"flight-rank{r}.json", entries=5)
        _feed(fr, ops)
        fr.write(_tracer(r))
    d = pickle.loads(dump_path(tmp_path, 0).read_bytes())
    assert [e["record_id"] for e in d["entries"]] == [3, 4, 5, 6, 7]
    ag = d["entries"][3]
    assert (ag["input_sizes"], ag["output_sizes"]) == ([[4]], [[8]])  # 32 B float32, 2 ranks
    db, _ = torch_db(tmp_path / "flight")
    assert verdicts(db) == [] and len(db.collectives) == 5
    full = FlightRecorder(tmp_path / "x.json")
    _feed(full, ops)
    rs = full.dump(_tracer(0))["entries"][2]
    assert (rs["input_sizes"], rs["output_sizes"]) == ([[16]], [[8]])


def test_the_json_view_is_the_dump_s(tmp_path):
    fr = FlightRecorder(tmp_path / "flight-rank0.json")
    _feed(fr, [("all_reduce", 64), ("all_reduce", 32)])
    fr.enter("dp", 2, "all_reduce", payload_bytes=16, dtype="float32", group_size=2, step=1,
             t_ns=9)
    fr.write(_tracer(0))
    d = pickle.loads(dump_path(tmp_path, 0).read_bytes())
    v = json.loads((tmp_path / "flight-rank0.json").read_text())
    assert v == json.loads(json.dumps(view(d)))
    g = v["groups"]["dp"]
    assert (g["issued"], g["completed"], g["open"]) == (3, 2, 1)
    assert g["in_flight"]["seq"] == 2 and g["last_completed"]["seq"] == 1
    assert [e["seq"] for e in g["ring"]] == [0, 1, 2]
    assert d["entries"][2]["state"] == "started" and d["entries"][0]["state"] == "completed"
