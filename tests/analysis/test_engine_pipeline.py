"""A pipeline run through the columnar scale path (engine.py, pipeline_spans.py, instances's
point-to-point matching): a hand-written two-stage GPipe trace whose bubble, transfers and
step times are worked out below, and a real pipeline run whose analysis has every table the
Python path gives it."""

from __future__ import annotations

import json
import math
import shutil

import pytest

from devtools.oracle import analyze_run_dir
from devtools.oracle import collectives as OC
from jobs.analysis import engine, write_analysis
from jobs.analysis.storage import convert
from tests.analysis import synth as T

STEPS = 4
SPEC = {"preset": "pp-gpipe", "parallel": {"pp": 2, "microbatches": 2}}
ACT, GRAD = 1000, 2000  # bytes of an activation / a gradient transfer
US = 1e-6

# One step, µs from its start (GPipe, 2 stages, 2 micro-batches; every transfer async):
#   rank 0 (stage 0): F0 [0,10] F1 [10,20]        B0 [46,58] B1 [58,70] opt [70,75]
#                     send act [10,12] [20,22]; recv grad [44,46] [56,58]; step [0,75]
#   rank 1 (stage 1): F0 [12,22] F1 [22,32] B0 [32,44] B1 [44,56] opt [56,61]
#                     recv act [0,13] [20,22]; send grad [44,46] [56,58]; step [0,72]
# Pipeline window: first to last action of either rank = [0,70].
#   rank 0 compute in it: [0,20] + [46,70] = 44 -> pipeline idle 26, bubble 26 ([20,46])
#   rank 1 compute in it: [12,61] = 49 (its optimizer counts) -> idle 21, all of it within
#     its step [0,72]: bubble [0,12] + [61,70] = 21
# rank 0: compute 20+24+5 = 49, comm [10,12][20,22][44,46][56,58] = 8, overlap 2+2 = 4;
#   the comm outside compute ([20,22], [44,46]) lies in the bubble: exposed 0, idle 0
# rank 1: compute 49, comm 13+2+2+2 = 19, overlap 1+2+2+2 = 7; its comm outside compute
#   ([0,12]) is bubble: exposed 0; busy 49 + 19 - 7 + 21 - 12 = 70, idle [70,72] = 2
HAND = {0: {"step_s": 75, "compute_s": 49, "comm_s": 8, "overlap_s": 4, "exposed_comm_s": 0,
            "bubble_s": 26, "idle_s": 0, "pipeline_window_s": 70, "pipeline_idle_s": 26},
        1: {"step_s": 72, "compute_s": 49, "comm_s": 19, "overlap_s": 7, "exposed_comm_s": 0,
            "bubble_s": 21, "idle_s": 2, "pipeline_window_s": 70, "pipeline_idle_s": 21}}


def _action(rank, step, t, a, mb, t0, t1):
    return T.span(rank, step, f"{a}{mb}", t + t0, t + t1, mb=mb, action=a, stage=rank,
                  chunk=0)


def _p2p(rank, step, t, op, peer, t0, t1, payload, seq):
    r = T.comm(rank, step, op, t + t0, t + t1, n=2, payload=payload, axis="pp",
               group=f"pp:p2p:{min(rank, peer)}-{max(rank, peer)}", seq=seq, peer=peer)
    r["async"] = True
    return r


def pipeline_run(out, steps=STEPS):
    spec = T.parse_spec(SPEC, max_world_size=1 << 30).to_dict()
    recs = {r: [T.meta(r, 2, {"pp": r, "dp": 0, "tp": 0}, SPEC)] for r in (0, 1)}
    for s in range(steps):
        t = 100 * s
        r0, r1 = recs[0], recs[1]
        r0 += [T.span(0, s, "step", t, t + 75, cat="step"),
               _action(0, s, t, "F", 0, 0, 10), _action(0, s, t, "F", 1, 10, 20),
               _p2p(0, s, t, "send", 1, 10, 12, ACT, 2 * s),
               _p2p(0, s, t, "send", 1, 20, 22, ACT, 2 * s + 1),
               _p2p(0, s, t, "recv", 1, 44, 46, GRAD, 2 * s),
               _action(0, s, t, "B", 0, 46, 58),
               _p2p(0, s, t, "recv", 1, 56, 58, GRAD, 2 * s + 1),
               _action(0, s, t, "B", 1, 58, 70), T.span(0, s, "optimizer", t + 70, t + 75)]
        r1 += [T.span(1, s, "step", t, t + 72, cat="step"),
               _p2p(1, s, t, "recv", 0, 0, 13, ACT, 2 * s),
               _action(1, s, t, "F", 0, 12, 22), _p2p(1, s, t, "recv", 0, 20, 22, ACT,
                                                      2 * s + 1),
               _action(1, s, t, "F", 1, 22, 32), _action(1, s, t, "B", 0, 32, 44),
               _p2p(1, s, t, "send", 0, 44, 46, GRAD, 2 * s), _action(1, s, t, "B", 1, 44, 56),
               _p2p(1, s, t, "send", 0, 56, 58, GRAD, 2 * s + 1),
               T.span(1, s, "optimizer", t + 56, t + 61)]
    for r in (0, 1):
        recs[r].append(T.end(r, 100 * steps))
    assert spec["parallel"]["pp"] == 2
    run = T.write(out, recs)
    convert.convert_run_dir(run)
    return run


def columnar(run, monkeypatch) -> dict:
    """analysis.json of the run through write_analysis (the one engine)."""
    head = write_analysis(run)
    assert "analysis_error" not in head, head
    got = json.loads((run / "analysis.json").read_text())
    assert got["engine"] == "columnar", got["warnings"]
    return got


def close(a, b):
    assert a is not None and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15), (a, b)


def test_hand_pipeline_through_the_scale_path(tmp_path, monkeypatch):
    got = columnar(pipeline_run(tmp_path / "run"), monkeypatch)
    t = got["tables"]
    assert len(t["step_rank"]) == 2 * STEPS
    for row in t["step_rank"]:
        for k, v in HAND[row["rank"]].items():
            close(row[k], v * US)
    # step time: the slower rank's step
    assert [r["step"] for r in t["throughput"]] == list(range(STEPS))
    for r in t["throughput"]:
        close(r["step_s"], 75 * US)
    bub = {r["stage"]: r for r in t["stage_bubbles"]}
    assert sorted(bub) == [0, 1]
    for stage, idle in ((0, 26), (1, 21)):
        b = bub[stage]
        assert b["ranks"] == [stage] and b["schedule"] == "gpipe" and b["p"] == 2
        close(b["window_s"], 70 * US)
        close(b["idle_s"], idle * US)
        close(b["measured_idle_fraction"], idle / 70)
        close(b["closed_form"], 1 / 3)  # (p - 1) / (m + p - 1)
        assert b["simulated"] is not None  # the simulator ran on the SQL stage times
    # p2p: every send met its recv; one instance per transfer
    coll = t["collectives"]
    assert len(coll) == 4 * STEPS
    assert {r["op"] for r in coll} == {"send_recv"} and all(r["complete"] for r in coll)
    assert sorted(r["payload_bytes"] for r in coll) == sorted([ACT] * 8 + [GRAD] * 8)
    first = min(coll, key=lambda r: r["start_ns"])  # step 0's first activation
    assert first["ranks"] == [0, 1] and first["last_rank"] == 0
    close(first["wait_s"], 10 * US)  # the recv was posted at 0, the send at 10
    close(first["duration_s"], 3 * US)  # from the later start (send) to the later end
    # bytes per link: rank 1 sends 2 gradients a step, rank 0 2 activations
    (link,) = t["links"]
    assert (link["axis"], link["link"], link["ranks"]) == ("pp", "intra", 2)
    close(link["bytes_sent_per_step"], 2 * GRAD)
    assert link["instances"] == 4 * (STEPS - 1)  # the steady steps' transfers
    axis = {r["rank"]: r for r in t["axis_bytes"]}
    close(axis[0]["bytes_sent_per_step"], 2 * ACT)
    close(axis[1]["bytes_sent_per_step"], 2 * GRAD)
    assert not [w for w in got["warnings"] if "bubble" in w or "failed" in w], got["warnings"]


def test_real_pipeline_run_has_every_table_of_the_python_path(pp_run, tmp_path,
                                                              monkeypatch):
    run = tmp_path / "pp"
    shutil.copytree(pp_run, run, ignore=shutil.ignore_patterns("*.parquet", "table-*",
                                                               "analysis.json"))
    convert.convert_run_dir(run)
    want = analyze_run_dir(run)
    assert want["engine"] == "python"
    got = columnar(run, monkeypatch)
    assert sorted(got["tables"]) == sorted(want["tables"])
    for name, rows in want["tables"].items():
        assert bool(got["tables"][name]) == bool(rows), name
        if rows and isinstance(rows[0], dict):
            assert set(got["tables"][name][0]) == set(rows[0]), name
    assert got["tables"]["stage_bubbles"] and got["tables"]["collectives"]
    assert not [w for w in got["warnings"] if "failed" in w], got["warnings"]


@pytest.mark.parametrize("steps", [1, 3])
def test_few_steps_keep_the_hand_figures(tmp_path, monkeypatch, steps):
    t = columnar(pipeline_run(tmp_path / "run", steps), monkeypatch)["tables"]
    for row in t["step_rank"]:
        close(row["bubble_s"], HAND[row["rank"]]["bubble_s"] * US)


def test_real_pipeline_run_equals_the_python_path(pp_run, tmp_path):
    from tests.analysis.test_engine import check
    run = tmp_path / "pp"
    shutil.copytree(pp_run, run, ignore=shutil.ignore_patterns("*.parquet", "table-*",
                                                               "analysis.json"))
    convert.convert_run_dir(run)
    want, _ = check(run)
    assert want["tables"]["stage_bubbles"] and want["tables"]["links"]


def three_hosts_run(out, steps=3):
    """pp 3 on two hosts (ranks 0 and 1 on host 0, rank 2 on host 1): per step rank 0 sends
    ACT bytes to rank 1 and rank 1 ACT to rank 2; no pipeline action (links only)."""
    recs = {}
    for r in range(3):
        m = T.meta(r, 3, {"pp": r, "dp": 0, "tp": 0})
        m["node_rank"] = 0 if r < 2 else 1
        recs[r] = [m]
    for s in range(steps):
        t = 100 * s
        for r in range(3):
            recs[r].append(T.span(r, s, "step", t, t + 50, cat="step"))
        for a, b in ((0, 1), (1, 2)):
            recs[a].append(_p2p(a, s, t, "send", b, 10 * a, 10 * a + 5, ACT, s))
            recs[b].append(_p2p(b, s, t, "recv", a, 10 * a, 10 * a + 6, ACT, s))
    for r in range(3):
        recs[r].append(T.end(r, 100 * steps))
    run = T.write(out, recs)
    convert.convert_run_dir(run)
    return run


def test_a_transfer_takes_the_link_of_its_two_ends(tmp_path, monkeypatch):
    """links: 0 -> 1 stays on host 0 (intra), 1 -> 2 crosses (inter), though the pp group
    of every rank spans both hosts."""
    t = columnar(three_hosts_run(tmp_path / "run"), monkeypatch)["tables"]
    rows = {(r["axis"], r["link"]): r for r in t["links"]}
    assert sorted(rows) == [("pp", "inter"), ("pp", "intra")]
    # intra: rank 0's sends and rank 1's receives (0 bytes sent); inter: rank 1's sends and
    # rank 2's receives
    for link in ("intra", "inter"):
        assert rows[("pp", link)]["ranks"] == 2
        close(rows[("pp", link)]["bytes_sent_per_step"], ACT)
    coll = t["collectives"]
    assert len(coll) == 6 and all(r["complete"] for r in coll)
    assert sorted(tuple(r["ranks"]) for r in coll) == [(0, 1)] * 3 + [(1, 2)] * 3


@pytest.mark.parametrize("chunk", [None, 7])
def test_point_to_point_instances_equal_the_oracle(tmp_path, monkeypatch, chunk):
    """instances matches sends with receives as collectives.match does (FIFO per pair and
    step), also when the step ranges are cut small (step_sweep.CHUNK_RECORDS)."""
    from jobs.analysis import instances as N
    from jobs.analysis import load_run_dir
    from jobs.analysis import step_sweep as NS
    from jobs.analysis import trace_sql as V
    if chunk is not None:
        monkeypatch.setattr(NS, "CHUNK_RECORDS", chunk)
    run = pipeline_run(tmp_path / "run")
    mt = V.meta_only(run)
    assert not engine.hidden_fields(V.connect(run))
    assert N.rows_of(list(N.instance_batches(mt, run)), mt) == \
        OC.collectives_table(load_run_dir(run))
