"""The analysis while the run goes (jobs/analysis/analyze_live.py): the passes fed with the
row groups the live conversion writes, then the post-run read from the first step they did
not reach, give the analysis of the post-run read alone; whatever breaks the live
analysis' expectation gives it up, and the post-run read then reads every pass."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from jobs.analysis import analyze_live, engine, write_analysis
from jobs.analysis import step_sweep as NS
from jobs.analysis.storage import columnar, convert, convert_live
from tests.analysis.test_columnar import dp_tp_run
from tests.analysis.test_convert_live import Flusher
from tests.analysis.test_engine import same
from tests.support.launch import run_job


@pytest.fixture
def small(monkeypatch):
    """Row groups of 8 rows, passes of at least one row and at most ~60 (several per run)."""
    monkeypatch.setattr(columnar, "ROW_GROUP_ROWS", 8)
    monkeypatch.setattr(analyze_live, "MIN_PASS_ROWS", 1)
    monkeypatch.setattr(NS, "CHUNK_RECORDS", 60)


def records(run: Path) -> dict[int, list[dict]]:
    """Each rank's records of a run folder's JSON lines (a torn last line left out)."""
    out = {}
    for p in sorted(run.glob("trace-rank*.jsonl")):
        recs = []
        for line in p.read_text().splitlines():
            try:
                recs.append(json.loads(line))
            except ValueError:
                continue
        out[int(p.stem.removeprefix("trace-rank"))] = recs
    return out


def fed(run: Path, per_rank: dict[int, list[dict]], per_round: int = 5, extra=None):
    """The ranks' records written to `run` as their flushers would, `per_round` records of
    every rank a round, the live conversion (with its analysis) polled after each round;
    `extra(round, flushers)` may write more. Returns the LiveRun, not finished."""
    run.mkdir(parents=True)
    fl = {r: Flusher(run / f"trace-rank{r}.jsonl") for r in per_rank}
    live = convert_live.LiveRun(run, analyse=True)
    rounds = max(len(v) for v in per_rank.values())
    for k, i in enumerate(range(0, rounds, per_round)):
        for r, recs in per_rank.items():
            if recs[i:i + per_round]:
                fl[r].write(recs[i:i + per_round])
        if extra is not None:
            extra(k, fl)
        live.poll()
    return live


def analysed(run: Path, live) -> dict:
    """The post-run step on a run fed live: the rest converted, the analysis resumed."""
    convert.convert_run_dir(run, live=live)
    return engine.analyze_columnar(run, live=live.analysis if live is not None else None)


def reference(src: Path, dst: Path) -> dict:
    """The post-run analysis alone of a copy of `src`'s lines and blocks."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.parquet", "*.live", "table-*"))
    return analysed(dst, None)


def dp_tp(tmp_path, **kw) -> dict[int, list[dict]]:
    return records(dp_tp_run(tmp_path / "src", **kw))


def union_ns(iv: list[tuple[int, int]]) -> int:
    """Length of a union of [t0, t1) intervals (a sweep over them sorted)."""
    total, end = 0, None
    for a, b in sorted(iv):
        if end is None or a > end:
            total, end = total + b - a, b
        elif b > end:
            total, end = total + b - end, b
    return total


def by_hand(got: dict, per_rank: dict[int, list[dict]]) -> None:
    """The analysis against figures computed here from the records fed: per rank and axis
    the bytes sent / received over the training steps and the setup bytes (axis_bytes), and
    per (step, rank) with a step span the time inside some collective (step_rank comm_s).
    The oracle the comparison with the post-run read (the same code) cannot be."""
    want: dict = {}
    comm: dict = {}
    spans: set = set()
    for rank, recs in per_rank.items():
        for r in recs:
            st = r.get("step", -1)
            if r.get("type") == "span" and r.get("cat") == "step" and st >= 0:
                spans.add((st, rank))
            if r.get("type") != "comm":
                continue
            w = want.setdefault((rank, r["axis"]), [0.0, 0.0, 0.0, set()])
            if st >= 0:
                w[0] += r["bytes_sent"]
                w[1] += r["bytes_recv"]
                w[3].add(st)
                comm.setdefault((st, rank), []).append((r["ts_ns"], r["ts_ns"] + r["dur_ns"]))
            else:
                w[2] += r["bytes_sent"]
    rows = {(x["rank"], x["axis"]): x for x in got["tables"]["axis_bytes"]}
    assert set(rows) == set(want)
    for k, (sent, recv, setup, steps) in want.items():
        x = rows[k]
        assert (x["bytes_sent"], x["bytes_recv"], x["setup_bytes_sent"]) == \
            pytest.approx((sent, recv, setup), rel=1e-12), k
        assert x["steps"] == len(steps | {st for st, r in spans if r == k[0]}), k
    step_rank = {(x["step"], x["rank"]): x for x in got["tables"]["step_rank"]}
    checked = 0
    for key in spans & set(comm):
        assert step_rank[key]["comm_s"] == pytest.approx(union_ns(comm[key]) / 1e9,
                                                         rel=1e-9, abs=1e-15), key
        checked += 1
    assert checked


@pytest.mark.parametrize("kw", [{"steps": 9}, {"steps": 9, "drop": (1, 4)},
                                {"steps": 9, "drop": (2, 6), "unfinished": (1, 5)}])
def test_the_live_analysis_is_the_post_run_analysis(tmp_path, small, kw):
    per_rank = dp_tp(tmp_path, **kw)
    live = fed(tmp_path / "run", per_rank)
    a = live.analysis
    assert a.failed is None and a.reader is not None and a.reader.next_step >= 4
    want = reference(tmp_path / "run", tmp_path / "ref")
    got = analysed(tmp_path / "run", live)
    assert a.failed is None and a.resumed >= 4  # the post-run read went on from step >= 4
    same(got, want)
    by_hand(got, per_rank)
    assert want["tables"]["collectives"] and want["tables"]["step_rank"]


def test_without_the_live_analysis_every_pass_is_read_after_the_run(tmp_path, small,
                                                                    monkeypatch):
    """The check can fail: a live analysis that fed nothing (or whose passes were lost)
    would not give the post-run analysis, so the resumed one is compared with it."""
    live = fed(tmp_path / "run", dp_tp(tmp_path, steps=9))
    live.analysis.reader.sums = type(live.analysis.reader.sums)()  # the live sums lost
    want = reference(tmp_path / "run", tmp_path / "ref")
    got = analysed(tmp_path / "run", live)
    with pytest.raises(AssertionError):
        same(got["tables"]["axis_bytes"], want["tables"]["axis_bytes"])


@pytest.fixture(scope="module")
def dp_tp_real(tmp_path_factory) -> Path:
    """A real 8-step DP 2 x TP 2 run of the reference engine (gloo): synchronous TP
    all-reduces inside compute, asynchronous DDP buckets, the setup broadcast."""
    return run_job(tmp_path_factory.mktemp("dp_tp_real"), {
        "preset": "ddp", "name": "live-analysis", "parallel": {"dp": 2, "tp": 2},
        "model": {"arch": "gpt"}, "runtime": {"nproc_per_node": 4}, "train": {"steps": 8}},
        4, timeout=240)


def test_a_real_run_fed_as_it_was_traced(dp_tp_real, tmp_path, small):
    """A real run's records, written to a fresh folder a few at a time in turn over the
    ranks as their flushers would, the live conversion and analysis polled each round."""
    per_rank = records(dp_tp_real)
    live = fed(tmp_path / "run", per_rank, per_round=7)
    shutil.copy(dp_tp_real / "summary.json", tmp_path / "run" / "summary.json")
    assert live.analysis.failed is None and live.analysis.reader is not None
    want = reference(tmp_path / "run", tmp_path / "ref")
    got = analysed(tmp_path / "run", live)
    assert live.analysis.resumed >= 3
    same(got, want)
    by_hand(got, per_rank)
    assert want["tables"]["collectives"] and want["tables"]["axis_bytes"]


@pytest.mark.parametrize("when", ["while the run goes", "after the run"])
def test_a_row_of_a_step_analysed_already_gives_it_up(tmp_path, small, when):
    """A record of step 0 written once step 0 was fed (a user's late sample), timed just
    after the rows fed so far (the live conversion writes it in a later round) or after
    every record (written by the conversion's finish, after the run): the live analysis is
    given up, its instance file removed, and the post-run read reads every pass."""
    per_rank = dp_tp(tmp_path, steps=9)
    at = len(per_rank[0]) // 5 // 2

    def late(k, fl):
        if k == at:
            ts = 10**12 if when == "after the run" else \
                max(x.get("ts_ns", 0) for x in per_rank[0][:5 * (k + 1)]) + 1
            fl[0].write([{"type": "mem", "rank": 0, "step": 0, "microbatch": None,
                          "ts_ns": ts, "params": 1}])
    live = fed(tmp_path / "run", per_rank, extra=late)
    assert live.analysis.reader is not None and live.analysis.reader.next_step > 0 \
        if when == "after the run" else "after steps up to" in live.analysis.failed
    want = reference(tmp_path / "run", tmp_path / "ref")
    got = analysed(tmp_path / "run", live)
    assert "after steps up to" in live.analysis.failed and live.analysis.resumed == 0
    assert not (tmp_path / "run" / "table-collectives.parquet").exists() or \
        got["table_files"] == {}  # small tables: the post-run read leaves no file either
    same(got, want)
    by_hand(got, per_rank)


def test_a_setup_collective_after_the_setup_pass_gives_it_up(tmp_path, small):
    per_rank = dp_tp(tmp_path, steps=9)
    for r in per_rank:
        end = per_rank[r].pop()
        per_rank[r].append({"type": "comm", "rank": r, "step": -1, "microbatch": None,
                            "op": "barrier", "axis": "dp", "group": "dp", "seq": 10**6,
                            "group_size": 2, "payload_bytes": 0, "bytes_sent": 0.0,
                            "bytes_recv": 0.0, "ts_ns": end["ts_ns"] - 2, "dur_ns": 1})
        per_rank[r].append(end)
    live = fed(tmp_path / "run", per_rank, per_round=3)
    live.poll()
    want = reference(tmp_path / "run", tmp_path / "ref")
    got = analysed(tmp_path / "run", live)
    assert "setup record after the setup pass" in live.analysis.failed
    same(got, want)
    by_hand(got, per_rank)


def test_a_rank_whose_live_conversion_is_given_up_gives_it_up(tmp_path, small):
    """A rank converted after the run (a restarted attempt, a record before its rows
    written...) holds other row numbers than the live analysis saw: given up."""
    per_rank = dp_tp(tmp_path, steps=9)
    live = fed(tmp_path / "run", per_rank)
    live.ranks[2]._give_up("a test")
    live.poll()
    assert "rank 2's live conversion was given up" in live.analysis.failed
    want = reference(tmp_path / "run", tmp_path / "ref")
    got = analysed(tmp_path / "run", live)
    same(got, want)
    by_hand(got, per_rank)


def test_a_missing_rank_feeds_nothing_and_holds_bounded_rows(tmp_path, small, monkeypatch):
    """A node of a multi-host run (or a rank without a file yet) holds some ranks only:
    nothing is fed, and rows held beyond MAX_HELD_ROWS give the live analysis up."""
    monkeypatch.setattr(analyze_live, "MAX_HELD_ROWS", 60)
    per_rank = dp_tp(tmp_path, steps=9)
    del per_rank[3]
    live = fed(tmp_path / "run", per_rank)
    assert live.analysis.reader is None and "rows held" in live.analysis.failed
    assert not live.analysis.ranks  # nothing held once given up


def test_a_pipeline_run_is_left_to_the_post_run_analysis(pp_run, tmp_path, small):
    """Its stages' sends and receives (point-to-point ops, which the scale path leaves to
    the Python path): given up at the first row group that holds one."""
    shutil.copytree(pp_run, tmp_path / "src", ignore=shutil.ignore_patterns(
        "*.parquet", "table-*", "analysis.json"))
    live = fed(tmp_path / "run", records(tmp_path / "src"))
    assert "point-to-point ops" in live.analysis.failed and live.analysis.reader is None


def test_write_analysis_goes_on_from_the_live_analysis(tmp_path, small):
    """The worker's call: write_analysis(live=...) takes the scale path from the live
    reader (resumed), and writes the analysis the post-run step alone writes."""
    per_rank = dp_tp(tmp_path, steps=9)
    live = fed(tmp_path / "run", per_rank)
    run = tmp_path / "run"
    convert.convert_run_dir(run, live=live)
    ref = tmp_path / "ref"
    shutil.copytree(run, ref, ignore=shutil.ignore_patterns("table-*"))
    assert "analysis_error" not in write_analysis(run, live=live.analysis)
    assert live.analysis.resumed >= 4
    assert "analysis_error" not in write_analysis(ref)
    got, want = (json.loads((d / "analysis.json").read_text()) for d in (run, ref))
    same(got, want)
    by_hand(got, per_rank)


def test_a_spec_placing_the_ranks_on_other_hosts_gives_it_up(tmp_path, small):
    """The instances' links are taken with the hosts of the meta's spec while the run goes;
    a post-run analysis whose spec places the ranks elsewhere reads every pass again."""
    from jobs.analysis import trace_sql as V
    live = fed(tmp_path / "run", dp_tp(tmp_path, steps=9))
    run = tmp_path / "run"
    convert.convert_run_dir(run, live=live)
    tr = engine.meta_traces(run, V.connect(run))
    path = {n: run / engine.FILE.format(n) for n in engine.BIG}
    assert live.analysis.hosts == {r: 0 for r in range(4)}  # one host: no node_rank, spec
    assert live.analysis.resume(run, tr, path, {r: r // 2 for r in range(4)}) is None
    assert "other hosts" in live.analysis.failed
    assert not (run / "table-collectives.parquet").exists()


def test_the_workers_post_run_step_goes_on_from_the_live_analysis(tmp_path, small,
                                                                 monkeypatch):
    """worker.tasks.JobSupervisor._analyze with the LiveRun its thread polled: the rest
    converted, the analysis resumed (its log line says from which step), and analysis.json
    the post-run one."""
    from jobs.spec import parse_spec
    from tests.analysis.test_columnar import SPEC
    from worker.tasks import JobSupervisor
    per_rank = dp_tp(tmp_path, steps=9)
    live = fed(tmp_path / "run", per_rank)
    want = reference(tmp_path / "run", tmp_path / "ref")
    sup = JobSupervisor.__new__(JobSupervisor)  # the post-run step only: no client, no job
    said: list[str] = []
    sup.out, sup.live, sup.say, sup.run_id = tmp_path / "run", live, said.append, "r"
    sup.spec = {**parse_spec(SPEC, max_world_size=64).to_dict(), "kind": "train"}
    head = sup._analyze(None)["headline"]
    assert "analysis_error" not in head
    note = next(x for x in said if "analysed while the job ran" in x)
    assert f"steps 0-{live.analysis.resumed - 1} analysed" in note and live.analysis.resumed >= 4
    got = json.loads((tmp_path / "run" / "analysis.json").read_text())
    want = json.loads(json.dumps(want))  # as written: tuples are lists
    assert got.pop("engine") == want.pop("engine") == "columnar"
    same(got, want)
    by_hand(got, per_rank)
