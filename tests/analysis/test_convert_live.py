"""The live conversion (jobs/analysis/storage/convert_live.py): what it writes while the blocks
arrive is the post-run conversion's file, row group for row group; whatever breaks its
expectation gives the rank up to the post-run conversion, with no live file left behind."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from jobs import trace_blocks as TB
from jobs.analysis.storage import columnar, convert, convert_live
from tests.analysis.test_blocks import ENC, traced_steps
from tests.analysis.test_convert import assert_same_file


@pytest.fixture
def small(monkeypatch):
    monkeypatch.setattr(columnar, "ROW_GROUP_ROWS", 4)


def step_records(steps: int, pid: int = 1) -> list[dict]:
    """A rank's records as the tracer appends them: each span when it ends, so the step span
    (started first) comes after the records inside it."""
    out = [{"type": "meta", "schema": 2, "rank": 0, "world_size": 1, "pid": pid}]
    t = 1000
    for s in range(steps):
        inner = []
        for i in range(3):
            inner.append({"type": "span", "rank": 0, "step": s, "microbatch": i % 2,
                          "name": "forward", "cat": "compute", "ts_ns": t + 10 + 20 * i,
                          "dur_ns": 15})
        inner.append({"type": "mem", "rank": 0, "step": s, "ts_ns": t + 75, "params": 3})
        out += inner
        out.append({"type": "span", "rank": 0, "step": s, "microbatch": None, "name": "step",
                    "cat": "step", "ts_ns": t, "dur_ns": 80})
        out.append({"type": "scalars", "rank": 0, "step": s, "ts_ns": t + 81, "loss": 1.0})
        t += 100
    out.append({"type": "end", "rank": 0, "ts_ns": t, "reason": "ok"})
    return out


class Flusher:
    """Appends lines and their block, a part at a time, as the tracer's flusher does."""

    def __init__(self, path: Path):
        self.path, self.at = path, 0
        path.write_text("")
        TB.blocks_path(path).write_bytes(b"")

    def write(self, recs: list[dict], block: bool = True) -> bytes:
        text = "".join(ENC(r) + "\n" for r in recs)
        raw = TB.encode(recs, self.at, self.at + len(text), ENC)
        with open(self.path, "a") as f:
            f.write(text)
        if block:
            with open(TB.blocks_path(self.path), "ab") as b:
                b.write(raw)
        self.at += len(text)
        return raw


def post_run(path: Path, where: Path) -> Path:
    """The post-run conversion's file of a copy of `path` and its blocks."""
    where.mkdir()
    for p in (path, TB.blocks_path(path)):
        if p.exists():
            shutil.copy(p, where / p.name)
    copy = where / path.name
    dest = columnar.parquet_path(copy)
    assert convert.convert_rank(copy, 0, dest)
    return dest


def feed(tmp_path: Path, recs: list[dict], per_block: int):
    path = tmp_path / "trace-rank0.jsonl"
    fl = Flusher(path)
    live = convert_live.LiveRun(tmp_path)
    written = []
    for i in range(0, len(recs), per_block):
        fl.write(recs[i:i + per_block])
        live.poll()
        written.append(live.ranks[0].rows)
    return path, fl, live, written


@pytest.mark.parametrize("per_block", [3, 7, 50])
def test_the_live_file_is_the_post_run_file(tmp_path, small, per_block):
    recs = step_records(12)
    path, _, live, written = feed(tmp_path, recs, per_block)
    assert written[-1] > 0 and written[-1] % 4 == 0  # whole row groups, before the end
    assert live.ranks[0].failed is None
    want = post_run(path, tmp_path / "ref")
    assert convert.convert_run_dir(tmp_path, live=live) == [columnar.parquet_path(path)]
    assert live.finished == {0: written[-1]} and not live.given_up and not live.ranks
    assert_same_file(columnar.parquet_path(path), want)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ref", path.name,
                                                          columnar.parquet_path(path).name]


def test_the_tracers_own_run_converts_live(tmp_path, small, monkeypatch):
    """A real Tracer (blocks of 5 records, a flush each step), polled after each step."""
    from jobs.trace import Tracer
    monkeypatch.setattr(TB, "BLOCK_RECORDS", 5)
    tr = Tracer(tmp_path, 0, 1, sync_clock=False, meta={"backend": "gloo"},
                flush_interval_s=60)
    live = convert_live.LiveRun(tmp_path)
    traced_steps(tr, 10, lambda step: (tr.flush(), live.poll()))
    assert live.ranks[0].rows > 0 and live.ranks[0].failed is None
    tr.close()
    path = tmp_path / "trace-rank0.jsonl"
    want = post_run(path, tmp_path / "ref")
    convert.convert_run_dir(tmp_path, live=live)
    assert_same_file(columnar.parquet_path(path), want)
    assert not TB.blocks_path(path).exists()


def test_a_record_before_the_written_rows_gives_the_rank_up(tmp_path, small):
    """A span across steps (started before the rows written) breaks the watermark: the live
    file goes, and the post-run conversion writes the rank whole."""
    recs = step_records(10)
    path, fl, live, _ = feed(tmp_path, recs[:-1], 5)
    assert live.ranks[0].rows > 0
    part = live.ranks[0].part
    assert part.exists()
    fl.write([{"type": "span", "rank": 0, "step": 0, "name": "epoch", "cat": "user",
               "ts_ns": 1001, "dur_ns": 9000}, recs[-1]])
    live.poll()
    assert "sorts before" in live.ranks[0].failed and not part.exists()
    want = post_run(path, tmp_path / "ref")
    convert.convert_run_dir(tmp_path, live=live)
    assert "sorts before" in live.given_up[0] and not live.finished
    assert_same_file(columnar.parquet_path(path), want)


def test_a_torn_block_is_read_once_whole(tmp_path, small):
    recs = step_records(10)
    path, fl, live, _ = feed(tmp_path, recs[:30], 6)
    raw = fl.write(recs[30:], block=False)
    bp = TB.blocks_path(path)
    with open(bp, "ab") as b:  # the flusher is mid-write
        b.write(raw[:len(raw) // 2])
    off = live.ranks[0].off
    live.poll()
    assert live.ranks[0].off == off and live.ranks[0].failed is None
    with open(bp, "ab") as b:
        b.write(raw[len(raw) // 2:])
    live.poll()
    assert live.ranks[0].off == bp.stat().st_size
    want = post_run(path, tmp_path / "ref")
    convert.convert_run_dir(tmp_path, live=live)
    assert_same_file(columnar.parquet_path(path), want)


def test_a_restarted_attempt_gives_the_rank_up(tmp_path, small):
    """torchrun restarts the job: the tracer rewrites its files from byte 0 (another meta).
    Even when the new file is already longer than what was read, it is noticed."""
    path, _, live, _ = feed(tmp_path, step_records(6), 5)
    assert live.ranks[0].rows > 0
    again = step_records(12, pid=2)
    fl = Flusher(path)
    for i in range(0, len(again), 5):
        fl.write(again[i:i + 5])
    live.poll()
    assert "rewritten" in live.ranks[0].failed
    want = post_run(path, tmp_path / "ref")
    convert.convert_run_dir(tmp_path, live=live)
    assert_same_file(columnar.parquet_path(path), want)


def test_a_killed_rank_is_converted_after_the_run(tmp_path, small):
    """Lines after the last block (SIGKILL before the pending block): not the blocks' file,
    so the post-run conversion takes it (blocks and lines)."""
    recs = step_records(10)
    path, fl, live, _ = feed(tmp_path, recs[:-8], 5)
    assert live.ranks[0].rows > 0
    fl.write(recs[-8:], block=False)
    want = post_run(path, tmp_path / "ref")
    part = live.ranks[0].part
    assert part.exists()
    assert not live.finish(0) and not columnar.parquet_path(path).exists()
    assert not part.exists()
    convert.convert_run_dir(tmp_path)
    assert_same_file(columnar.parquet_path(path), want)
    import pyarrow.parquet as pq
    md = pq.read_schema(columnar.parquet_path(path)).metadata
    assert md[columnar.ORIGIN_KEY] == b"blocks+lines"


def test_without_step_spans_rows_are_held_until_the_end(tmp_path, small):
    """Nothing is final before the run ends: the rows are written then, from the blocks
    already decoded."""
    recs = [r for r in step_records(10) if r.get("cat") != "step"]
    path, _, live, written = feed(tmp_path, recs, 5)
    assert written[-1] == 0 and not live.ranks[0].part.exists()
    want = post_run(path, tmp_path / "ref")
    convert.convert_run_dir(tmp_path, live=live)
    assert live.finished == {0: 0}
    assert_same_file(columnar.parquet_path(path), want)


def test_rows_held_beyond_the_cap_give_the_rank_up(tmp_path, small, monkeypatch):
    """Memory stays bounded when no watermark comes (no step spans)."""
    monkeypatch.setattr(convert_live, "MAX_HELD_ROWS", 20)
    recs = [r for r in step_records(10) if r.get("cat") != "step"]
    path, _, live, _ = feed(tmp_path, recs, 5)
    assert "rows held" in live.ranks[0].failed and not live.ranks[0].held
    want = post_run(path, tmp_path / "ref")
    convert.convert_run_dir(tmp_path, live=live)
    assert "rows held" in live.given_up[0]
    assert_same_file(columnar.parquet_path(path), want)


def test_the_workers_thread_converts_while_the_job_writes(tmp_path, small):
    """worker.live.LiveConversion: polled in its thread while the blocks arrive."""
    from worker.live import LiveConversion
    recs = step_records(12)
    path = tmp_path / "trace-rank0.jsonl"
    fl = Flusher(path)
    conv = LiveConversion(tmp_path, 0.01)
    for i in range(0, len(recs), 6):
        fl.write(recs[i:i + 6])
    deadline = time.monotonic() + 60  # a polling deadline, not a timing assertion
    while not (conv.run.ranks.get(0) and conv.run.ranks[0].off == TB.blocks_path(path)
               .stat().st_size) and time.monotonic() < deadline:
        time.sleep(0.01)
    live = conv.close()
    assert live.ranks[0].rows > 0
    want = post_run(path, tmp_path / "ref")
    convert.convert_run_dir(tmp_path, live=live)
    assert_same_file(columnar.parquet_path(path), want)


def test_a_stop_ends_a_poll_between_blocks(tmp_path, small):
    """The worker's stop (the job ended; a cancel waits on its report) is not held up by a
    long catch-up: the blocks left are read after, by finish."""
    import threading
    recs = step_records(12)
    path = tmp_path / "trace-rank0.jsonl"
    fl = Flusher(path)
    for i in range(0, len(recs), 6):
        fl.write(recs[i:i + 6])
    live = convert_live.LiveRun(tmp_path)
    stop = threading.Event()
    stop.set()
    assert live.poll(stop) == 0 and live.ranks[0].off == 0
    want = post_run(path, tmp_path / "ref")
    convert.convert_run_dir(tmp_path, live=live)
    assert live.finished == {0: 0}
    assert_same_file(columnar.parquet_path(path), want)
