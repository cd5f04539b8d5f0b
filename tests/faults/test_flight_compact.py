"""The flight recorder keeps compact entries and builds torch's dicts when it dumps
(jobs/flight.py): a dump equals the dicts written out by hand here, its frames are the
issuing stack as Python's traceback module reads it, the per-turn JSON view equals the view of
the dump in every ring state, and the flusher's torch dump waits while the ring moves but is
on disk once it stops. The tracer's counts on untraced steps equal a traced run's."""

from __future__ import annotations

import json
import pickle
import traceback
from types import SimpleNamespace

from jobs import flight
from jobs.flight import FRAMES, FlightRecorder, dump_path, frames_here, view
from jobs.trace import Tracer
from jobs.trace_schedule import NO_SAMPLES


def _tracer(rank=0, world=2, ranks=None):
    return SimpleNamespace(rank=rank, world_size=world, coords={}, step=3, steps_completed=3,
                           last_progress_ns=7, now=lambda: 11,
                           group_ranks={"dp": ranks or list(range(world))})


def _issue():
    """frames_here() and Python's own reading of the same stack, on one line."""
    return frames_here(), traceback.extract_stack()


def test_a_dump_from_compact_entries_is_torch_s_dicts(tmp_path):
    fr = FlightRecorder(tmp_path / "flight-rank0.json", backend="gloo", timeout_ms=600000)
    frames, ref = _issue()
    e = fr.enter("dp", 0, "all_reduce", payload_bytes=64, dtype="float32", group_size=2,
                 step=1, t_ns=100, frames=frames)
    fr.done("dp", e, 150)
    fr.enter("dp", 1, "isend", payload_bytes=8, dtype="int64", group_size=2, step=1, t_ns=200,
             peer=1)
    fr.enter("solo", 0, "all_gather", payload_bytes=32, dtype="float32", group_size=4, step=1,
             t_ns=300)
    d = fr.dump(_tracer())
    want_frames = [{"name": f.name, "filename": f.filename, "line": f.lineno}
                   for f in reversed(ref)][:FRAMES]
    common = {"thread_name": "MainThread", "timeout_ms": 600000}
    assert d["entries"][0] == {
        **common, "record_id": 0, "pg_id": 0, "process_group": ("dp", "dp"),
        "thread_id": d["entries"][0]["thread_id"], "collective_seq_id": 0, "p2p_seq_id": 0,
        "op_id": 0, "profiling_name": "gloo:all_reduce", "time_created_ns": 100,
        "input_sizes": [[16]], "input_dtypes": ["Float"], "output_sizes": [[16]],
        "output_dtypes": ["Float"], "state": "completed", "time_discovered_started_ns": 100,
        "time_discovered_completed_ns": 150, "retired": True, "is_p2p": False,
        "frames": want_frames,
        "paralab": {"group": "dp", "op": "all_reduce", "payload_bytes": 64,
                    "dtype": "float32", "group_size": 2, "step": 1, "peer": None}}
    assert d["entries"][0]["thread_id"].isdigit()
    send = d["entries"][1]  # rank 0 sends to group rank 1: torch's p2p name
    assert (send["profiling_name"], send["is_p2p"], send["collective_seq_id"],
            send["p2p_seq_id"], send["op_id"], send["state"], send["retired"],
            send["time_discovered_completed_ns"], send["input_sizes"],
            send["input_dtypes"]) == ("gloo:send 0->1", True, 1, 0, 1, "started", False,
                                      None, [[1]], ["Long"])
    [solo] = d["paralab"]["other_entries"]  # a group of unknown ranks: not torch's to read
    assert (solo["pg_id"], solo["profiling_name"], solo["input_sizes"],
            solo["output_sizes"]) == (1, "gloo:all_gather", [[2]], [[8]])
    assert d["pg_status"] == {
        "dp": {"last_enqueued_collective": 0, "last_started_collective": 0,
               "last_completed_collective": 0},
        "solo": {"last_enqueued_collective": 0, "last_started_collective": 0,
                 "last_completed_collective": -1}}
    fr.write(_tracer())  # pickled as built: torch's analyzer reads the file (test_fr_trace)
    assert pickle.loads(dump_path(tmp_path, 0).read_bytes())["entries"] == d["entries"]


def _views_agree(fr, tr):
    assert fr.view(tr) == view(fr.dump(tr))


def test_the_per_turn_view_is_the_dump_s_in_every_ring_state(tmp_path):
    tr = _tracer(world=3, ranks=[0, 1, 2])
    fr = FlightRecorder(tmp_path / "flight-rank0.json", entries=5)
    _views_agree(fr, tr)  # empty
    handles = []
    for i in range(4):
        key = "dp" if i % 2 == 0 else "tp"
        handles.append((key, fr.enter(key, fr.next_seq(key), "all_reduce", payload_bytes=8 * i,
                                      dtype="float32", group_size=3, step=i, t_ns=10 * i)))
    _views_agree(fr, tr)  # all open
    fr.done(*handles[2], 50)
    fr.done(*handles[0], 40)  # completed later, issued earlier
    _views_agree(fr, tr)
    for i in range(6):  # tp: 2 + 6 issued; the ring wraps: dp's open and completed entries leave it
        h = fr.enter("tp", fr.next_seq("tp"), "broadcast", payload_bytes=4, dtype=None,
                     group_size=3, step=9, t_ns=100 + i)
        if i < 3:
            fr.done("tp", h, 200 - i)  # completion order differs from issue order
    _views_agree(fr, tr)
    fr.resize(8)
    fr.enter("dp", fr.next_seq("dp"), "send", payload_bytes=4, dtype="int32", group_size=3,
             step=9, t_ns=300, peer=2)
    _views_agree(fr, tr)
    v = fr.view(tr)
    assert v["groups"]["dp"]["open"] == 1 and v["groups"]["tp"]["issued"] == 8


def test_the_flusher_s_dump_waits_while_the_ring_moves(tmp_path, monkeypatch):
    monkeypatch.setattr(flight, "DUMP_EVERY_S", 1e9)  # only the quiet rule can write it
    monkeypatch.setattr(flight, "VIEW_EVERY_S", 0.0)  # the view every turn (tested below)
    tr = _tracer()
    fr = FlightRecorder(tmp_path / "flight-rank0.json")

    def op(seq):
        fr.done("dp", fr.enter("dp", seq, "all_reduce", payload_bytes=8, dtype="float32",
                               group_size=2, step=seq, t_ns=seq), seq + 1)

    def on_disk():
        d = pickle.loads(dump_path(tmp_path, 0).read_bytes())
        js = (tmp_path / "flight-rank0.json").read_text()
        return len(d["entries"]), js

    op(0)
    fr.write(tr, periodic=True)  # the first turn writes both
    assert on_disk()[0] == 1
    op(1)
    fr.write(tr, periodic=True)  # the ring moved since the last turn: the view only
    n, js = on_disk()
    assert n == 1 and '"issued": 2' in js and fr.dirty  # the next turn looks again
    fr.write(tr, periodic=True)  # quiet since the last turn (blocked, idle): the dump too
    assert on_disk()[0] == 2
    op(2)
    fr.write(tr)  # every other write (close, a fault's last words) has both
    assert on_disk()[0] == 3


def test_the_flusher_s_view_waits_while_the_ring_moves_and_not_once_it_stops(tmp_path,
                                                                             monkeypatch):
    """A moving rank's view is rewritten at most every VIEW_EVERY_S; a turn that finds the ring
    where the previous turn left it (a blocked rank) writes it at once. The clock is injected:
    flight's `time.monotonic`."""
    clock = [100.0]
    monkeypatch.setattr(flight.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(flight, "DUMP_EVERY_S", 1e9)
    monkeypatch.setattr(flight, "VIEW_EVERY_S", 1.0)
    tr = _tracer()
    fr = FlightRecorder(tmp_path / "flight-rank0.json")
    issued = lambda: json.loads((tmp_path / "flight-rank0.json").read_text())[  # noqa: E731
        "groups"]["dp"]["issued"]

    def op(seq):
        fr.done("dp", fr.enter("dp", seq, "all_reduce", payload_bytes=8, dtype="float32",
                               group_size=2, step=seq, t_ns=seq), seq + 1)

    op(0)
    fr.write(tr, periodic=True)  # the first turn writes both
    assert issued() == 1
    op(1)
    clock[0] += 0.25
    fr.write(tr, periodic=True)  # moving, 0.25 s after the last view: nothing written
    assert issued() == 1 and fr.dirty
    op(2)
    clock[0] += 0.8
    fr.write(tr, periodic=True)  # moving, 1.05 s after it: the view
    assert issued() == 3
    op(3)
    clock[0] += 0.25
    fr.write(tr, periodic=True)  # moved, too soon
    assert issued() == 3
    clock[0] += 0.25
    fr.write(tr, periodic=True)  # blocked since the previous turn: written at once, 0.5 s on
    assert issued() == 4 and len(pickle.loads(dump_path(tmp_path, 0).read_bytes())[
        "entries"]) == 4


def _feed(tr):
    for step in range(3):
        tr.begin_step(step)
        for op, kw in (("all_reduce", {}), ("reduce_scatter", {}),
                       ("broadcast", {"is_root": step == 1, "group": "g2"})):
            tr.comm_start(op, payload_bytes=1000 + step, group_size=4, axis="dp",
                          **kw).done(end="wait")
        with tr.comm("all_gather", payload_bytes=96, group_size=4, axis="tp"):
            pass


def test_untraced_steps_count_every_collective_as_a_traced_run(tmp_path):
    from jobs.spec import parse_spec
    runs = {}
    for level in ("layer", "off"):
        tr = Tracer(tmp_path / level, 0, 1, meta={"backend": "gloo"}, cuda_events=False,
                    sync_clock=False)
        trace = {"level": "off"} if level == "off" else {"steps": "all"}
        tr.configure(parse_spec({"runtime": {"nproc_per_node": 1}, "trace": trace}).trace)
        _feed(tr)
        h = tr.comm_start("all_reduce", payload_bytes=8, group_size=4, axis="dp")
        h.done(end="wait")
        rec = {k: v for k, v in h.rec.items() if k != "rank"}  # `rank`: added when written
        assert rec.pop("dur_ns") >= 0 and rec.pop("ts_ns") > 0
        runs[level] = (tr.comm_totals, tr.comm_by_step, rec, dict(tr._done))
        tr.close()
    assert "off" in NO_SAMPLES
    assert runs["off"] == runs["layer"]
    totals, by_step, rec, last = runs["off"]
    assert totals["dp/all_reduce"]["count"] == 4 and totals["g2/broadcast"]["count"] == 3
    # gloo runs reduce-scatter as an all-reduce: its backend bytes are the all-reduce's
    rs = totals["dp/reduce_scatter"]
    assert rs["backend_bytes_sent"] == 2 * rs["bytes_sent"]
    assert sorted(by_step) == ["dp", "tp"] and sorted(by_step["dp"]) == [0, 1, 2]
    assert (rec["type"], rec["op"], rec["seq"], rec["end"]) == ("comm", "all_reduce", 6,
                                                                "wait")
    assert last == {"dp": 6, "g2": 2, "tp": 2}
